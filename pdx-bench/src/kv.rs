//! A KV-cache handoff shaped like SGLang's: the prefill side holds one K and
//! one V buffer per layer, each an array of pages; a request's pages sit at
//! scattered page indices on both sides; runs contiguous on both sides are
//! merged, and all layers' blocks go out as one batch per request.

use std::time::{Duration, Instant};

use pdx::transfer::Request;
use serde_json::{json, Value};

use crate::memory::Buffer;
use crate::report::human_bytes;
use crate::run::Context;
use crate::{pattern, Op};

/// A model's KV shape.
struct Shape {
    name: &'static str,
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    dtype_bytes: usize,
}

const SHAPES: &[Shape] = &[
    Shape { name: "qwen3-8b", layers: 36, kv_heads: 8, head_dim: 128, dtype_bytes: 2 },
    Shape { name: "llama3-8b", layers: 32, kv_heads: 8, head_dim: 128, dtype_bytes: 2 },
    Shape { name: "llama3-70b", layers: 80, kv_heads: 8, head_dim: 128, dtype_bytes: 2 },
];

/// `count` distinct page indices out of `pool`, in runs of 1..=8 pages at
/// random places: what a paged allocator hands out after some churn.
fn scattered_pages(rng: &mut fastrand::Rng, pool: usize, count: usize) -> Vec<usize> {
    let mut used = vec![false; pool];
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        let run = rng.usize(1..=8);
        let start = rng.usize(..pool);
        for (p, taken) in used.iter_mut().enumerate().take((start + run).min(pool)).skip(start) {
            if out.len() < count && !*taken {
                *taken = true;
                out.push(p);
            }
        }
    }
    out
}

/// Merge index pairs into runs contiguous on both sides: (src, dst, len).
fn contiguous_runs(src: &[usize], dst: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (&s, &d) in src.iter().zip(dst) {
        match runs.last_mut() {
            Some((rs, rd, n)) if *rs + *n == s && *rd + *n == d => *n += 1,
            _ => runs.push((s, d, 1)),
        }
    }
    runs
}

pub fn run(ctx: &Context<'_>) -> Result<Vec<Value>, String> {
    let opts = ctx.opts;
    let shape = SHAPES
        .iter()
        .find(|s| s.name == opts.kv_model)
        .ok_or_else(|| format!("unknown model {:?}; known: qwen3-8b, llama3-8b, llama3-70b", opts.kv_model))?;
    let page_tokens = opts.kv_page_tokens.max(1);
    let page_bytes = page_tokens * shape.kv_heads * shape.head_dim * shape.dtype_bytes;
    let pages = opts.kv_tokens.div_ceil(page_tokens).max(1);
    let buffers = 2 * shape.layers; // K and V per layer
                                    // Pool twice the handoff so pages can scatter; shrink to fit the target.
    let mut pool = 2 * pages;
    while pool > pages && buffers * pool * page_bytes > ctx.remote_len {
        pool -= 1;
    }
    if buffers * pool * page_bytes > ctx.remote_len {
        return Err(format!(
            "the KV pool ({} for {} tokens) does not fit the target buffer ({}); raise --buffer or lower --kv-tokens",
            human_bytes(buffers * pages * page_bytes),
            opts.kv_tokens,
            human_bytes(ctx.remote_len)
        ));
    }
    let buffer_bytes = pool * page_bytes;
    let mut local = Buffer::new(buffers * buffer_bytes).map_err(|e| format!("cannot map the prefill pool: {e}"))?;
    pattern::fill(local.as_mut_slice(), 23);
    let (local_base, remote_base) = (local.addr() as usize, ctx.remote_addr);
    let mut rng = fastrand::Rng::with_seed(0x5eed_1234_5678_9abc);
    let mut latencies = Vec::new();
    let mut last: Vec<Request> = Vec::new();
    let handoff_bytes = (buffers * pages * page_bytes) as u64;
    for h in 0..=opts.kv_handoffs.max(1) {
        let src = scattered_pages(&mut rng, pool, pages);
        let dst = scattered_pages(&mut rng, pool, pages);
        let runs = contiguous_runs(&src, &dst);
        let mut reqs = Vec::with_capacity(buffers * runs.len());
        for b in 0..buffers {
            for &(s, d, n) in &runs {
                reqs.push(Request {
                    local: local_base + b * buffer_bytes + s * page_bytes,
                    remote: remote_base + (b * buffer_bytes + d * page_bytes) as u64,
                    len: n * page_bytes,
                });
            }
        }
        let t0 = Instant::now();
        // SAFETY: every local range lies in `local`, alive until the end.
        unsafe { ctx.engine.transfer_sync(ctx.session, ctx.direction(), reqs.clone()) }
            .map_err(|e| format!("KV handoff {h}: {e}"))?;
        if h > 0 {
            latencies.push(t0.elapsed()); // handoff 0 warms up
        }
        last = reqs;
    }
    latencies.sort_unstable();
    let p50 = latencies[latencies.len() / 2];
    let gbps = handoff_bytes as f64 / p50.as_secs_f64() / 1e9;
    let tokens_per_s = opts.kv_tokens as f64 / p50.as_secs_f64();
    let s_per_32k = 32768.0 / tokens_per_s;
    let entries = last.len();
    println!(
        "\nKV handoff ({}; {} tokens, {} tokens/page, {} per page per layer, K and V per layer)",
        shape.name,
        opts.kv_tokens,
        page_tokens,
        human_bytes(page_bytes)
    );
    println!(
        "{:>8} {:>12} {:>10} {:>9} {:>12} {:>22}",
        "entries", "bytes", "p50", "GB/s", "tokens/s", "s per 32k-token handoff"
    );
    println!(
        "{entries:>8} {:>12} {:>8.1}ms {gbps:>9.3} {tokens_per_s:>12.0} {s_per_32k:>14.2} (extrapolated)",
        human_bytes(handoff_bytes as usize),
        p50.as_secs_f64() * 1e3
    );
    match opts.op {
        Op::Write => verify_last_write(ctx, &last)?,
        Op::Read => verify_last_read(ctx, &last)?,
    }
    Ok(vec![json!({
        "model": shape.name, "tokens": opts.kv_tokens, "page_tokens": page_tokens, "page_bytes": page_bytes,
        "entries_per_batch": entries, "bytes_per_handoff": handoff_bytes, "handoffs": latencies.len(),
        "p50_s": p50.as_secs_f64(), "p99_s": latencies[latencies.len() - 1].as_secs_f64(),
        "gb_per_s": gbps, "tokens_per_s": tokens_per_s, "seconds_per_32k_handoff_extrapolated": s_per_32k,
        "latencies_s": latencies.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(),
    })])
}

/// The last handoff's pages must have arrived from the target, byte for byte.
fn verify_last_read(ctx: &Context<'_>, reqs: &[Request]) -> Result<(), String> {
    for r in reqs {
        // SAFETY: the range lies in the local pool, still mapped.
        let local = unsafe { std::slice::from_raw_parts(r.local as *const u8, r.len) };
        let off = (r.remote - ctx.remote_addr) as usize;
        if !pattern::matches_at(local, crate::run::TARGET_SEED, off) {
            return Err(format!("KV verification failed: pages read from remote offset {off} differ"));
        }
    }
    println!("verified the last handoff's {} blocks against the target's data", reqs.len());
    Ok(())
}

/// The last handoff's pages must be on the target, byte for byte.
fn verify_last_write(ctx: &Context<'_>, reqs: &[Request]) -> Result<(), String> {
    let ranges: Vec<(usize, usize)> = reqs.iter().map(|r| ((r.remote - ctx.remote_addr) as usize, r.len)).collect();
    let remote = ctx.remote_checksums(&ranges)?;
    for (r, sum) in reqs.iter().zip(&remote) {
        // SAFETY: the range lies in the local pool, still mapped.
        let local = unsafe { std::slice::from_raw_parts(r.local as *const u8, r.len) };
        if pattern::checksum(local) != *sum {
            return Err(format!("KV verification failed at remote offset {}", r.remote - ctx.remote_addr));
        }
    }
    println!("verified the last handoff's {} blocks on the target", reqs.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_distinct_and_runs_merge_on_both_sides() {
        let mut rng = fastrand::Rng::with_seed(1);
        let p = scattered_pages(&mut rng, 100, 50);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 50);
        assert_eq!(contiguous_runs(&[1, 2, 3, 7], &[10, 11, 5, 6]), vec![(1, 10, 2), (3, 5, 1), (7, 6, 1)]);
    }
}
