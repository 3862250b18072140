//! A KV-cache handoff shaped like SGLang's: the prefill side holds one K and
//! one V buffer per layer, each an array of pages; a request's pages sit at
//! scattered page indices on both sides; pdx's KV planner merges runs
//! contiguous on both sides, and all layers' blocks go out as one batch per
//! request (or, with --layerwise, one batch per layer as it is computed).

use std::time::{Duration, Instant};

use pdx::transfer::kv::{KvBuffer, KvPlan};
use pdx::transfer::{Request, TaskState, TransferBackend};
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

/// Plan through the C ABI (`pdx_kv_plan_new` + `pdx_kv_plan_requests`),
/// as a C++ engine would: the time and the request count.
fn plan_through_c_abi(
    local: &[KvBuffer],
    remote: &[KvBuffer],
    src: &[i32],
    dst: &[i32],
) -> Result<(Duration, usize), String> {
    use pdx::ffi::kv::{pdx_kv_buffer, pdx_kv_plan, pdx_kv_plan_free, pdx_kv_plan_new, pdx_kv_plan_requests};
    let c = |b: &[KvBuffer]| -> Vec<pdx_kv_buffer> {
        b.iter().map(|b| pdx_kv_buffer { base: b.base, page_bytes: b.page_bytes, pages: b.pages }).collect()
    };
    let (l, r) = (c(local), c(remote));
    let mut plan: *mut pdx_kv_plan = std::ptr::null_mut();
    let mut n = 0usize;
    let t0 = Instant::now();
    // SAFETY: every array holds the length passed with it; the out-params are live locals.
    let (made, counted) = unsafe {
        let made = pdx_kv_plan_new(
            l.as_ptr(),
            r.as_ptr(),
            l.len(),
            src.as_ptr(),
            dst.as_ptr(),
            src.len(),
            std::ptr::null(),
            &mut plan,
        );
        (made, if made == 0 { pdx_kv_plan_requests(plan, 0, l.len(), &mut n) } else { made })
    };
    let took = t0.elapsed();
    pdx_kv_plan_free(plan);
    if made != 0 || counted != 0 {
        return Err(format!("pdx_kv_plan_new / pdx_kv_plan_requests failed with status {made} / {counted}"));
    }
    Ok((took, n))
}

/// The median of `v` (sorted in place).
fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Wait for every batch of `ids` and free it; an error if one failed.
fn land(engine: &dyn TransferBackend, ids: &[u64]) -> Result<(), String> {
    for &id in ids {
        let s = engine.batch_wait(id, Duration::from_secs(120)).map_err(|e| format!("layer batch: {e}"))?;
        engine.batch_free(id).map_err(|e| e.to_string())?;
        if s.state != TaskState::Completed {
            return Err(format!("a layer batch failed ({} of {} requests)", s.failed, s.total));
        }
    }
    Ok(())
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
    let mut local = Buffer::with_pages(buffers * buffer_bytes, opts.huge)
        .map_err(|e| format!("cannot map the prefill pool: {e}"))?;
    pattern::fill(local.as_mut_slice(), 23);
    // The prefill pool is registered, as a serving stack registers it.
    let _registered = crate::run::Registered::new(ctx.engine, local.addr(), local.len())?;
    let (local_base, remote_base) = (local.addr(), ctx.remote_addr);
    let side = |base: u64| -> Vec<KvBuffer> {
        (0..buffers as u64)
            .map(|b| KvBuffer {
                base: base + b * buffer_bytes as u64,
                page_bytes: page_bytes as u64,
                pages: pool as u64,
            })
            .collect()
    };
    let (local_bufs, remote_bufs) = (side(local_base), side(remote_base));
    let limit = ctx.engine.max_batch_entries();
    let compute = Duration::from_micros(opts.layer_compute_us);
    let mut rng = fastrand::Rng::with_seed(0x5eed_1234_5678_9abc);
    let (mut latencies, mut planning, mut whole_tail, mut layer_tail) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last: Vec<Request> = Vec::new();
    let mut requests = 0;
    let handoff_bytes = (buffers * pages * page_bytes) as u64;
    for h in 0..=opts.kv_handoffs.max(1) {
        let src: Vec<i32> = scattered_pages(&mut rng, pool, pages).into_iter().map(|p| p as i32).collect();
        let dst: Vec<i32> = scattered_pages(&mut rng, pool, pages).into_iter().map(|p| p as i32).collect();
        let (took, n) = plan_through_c_abi(&local_bufs, &remote_bufs, &src, &dst)?;
        let plan = KvPlan::new(&local_bufs, &remote_bufs, &src, &dst, None).map_err(|e| e.to_string())?;
        let reqs = plan.requests(0, buffers, limit).map_err(|e| e.to_string())?;
        requests = n;
        let t0 = Instant::now();
        // SAFETY: every local range lies in `local`, alive until the end.
        unsafe { ctx.engine.transfer_sync(ctx.session, ctx.direction(), reqs.clone()) }
            .map_err(|e| format!("KV handoff {h}: {e}"))?;
        if h > 0 {
            latencies.push(t0.elapsed()); // handoff 0 warms up
            planning.push(took);
        }
        if opts.layerwise {
            // Whole request after compute: every layer computed, then one transfer.
            for _ in 0..shape.layers {
                std::thread::sleep(compute);
            }
            let t = Instant::now();
            // SAFETY: as above.
            unsafe { ctx.engine.transfer_sync(ctx.session, ctx.direction(), reqs.clone()) }
                .map_err(|e| format!("KV handoff {h}: {e}"))?;
            let whole = t.elapsed();
            // Layer-wise: each layer's K and V go out as soon as it is computed.
            let mut ids = Vec::with_capacity(shape.layers);
            for layer in 0..shape.layers {
                std::thread::sleep(compute);
                let reqs = plan.requests(2 * layer, 2 * layer + 2, limit).map_err(|e| e.to_string())?;
                // SAFETY: as above; `land` waits for every batch before `local` can go.
                ids.push(
                    unsafe { ctx.engine.submit(ctx.session, ctx.direction(), reqs, None) }
                        .map_err(|e| e.to_string())?,
                );
            }
            let t = Instant::now();
            land(ctx.engine, &ids)?;
            if h > 0 {
                whole_tail.push(whole);
                layer_tail.push(t.elapsed());
            }
        }
        last = reqs;
    }
    let p99 = *latencies.iter().max().unwrap_or(&Duration::ZERO);
    let p50 = median(&mut latencies);
    let plan_p50 = median(&mut planning);
    let gbps = handoff_bytes as f64 / p50.as_secs_f64() / 1e9;
    let tokens_per_s = opts.kv_tokens as f64 / p50.as_secs_f64();
    let s_per_32k = 32768.0 / tokens_per_s;
    println!(
        "\nKV handoff ({}; {} tokens, {} tokens/page, {} per page per layer, K and V per layer; planned by pdx_kv_plan_new)",
        shape.name,
        opts.kv_tokens,
        page_tokens,
        human_bytes(page_bytes)
    );
    println!(
        "{:>8} {:>9} {:>12} {:>10} {:>10} {:>9} {:>12} {:>22}",
        "pages", "requests", "bytes", "planning", "p50", "GB/s", "tokens/s", "s per 32k-token handoff"
    );
    println!(
        "{pages:>8} {requests:>9} {:>12} {:>8.3}ms {:>8.1}ms {gbps:>9.3} {tokens_per_s:>12.0} {s_per_32k:>14.2} (extrapolated)",
        human_bytes(handoff_bytes as usize),
        plan_p50.as_secs_f64() * 1e3,
        p50.as_secs_f64() * 1e3
    );
    println!(
        "planning is {:.3}% of the transfer ({} buffers x {pages} pages -> {requests} requests)",
        100.0 * plan_p50.as_secs_f64() / p50.as_secs_f64(),
        buffers
    );
    let mut row = json!({
        "model": shape.name, "tokens": opts.kv_tokens, "page_tokens": page_tokens, "page_bytes": page_bytes,
        "pages": pages, "buffers": buffers, "requests": requests, "entries_per_batch": last.len(),
        "bytes_per_handoff": handoff_bytes, "handoffs": latencies.len(),
        "planning_p50_s": plan_p50.as_secs_f64(),
        "p50_s": p50.as_secs_f64(), "p99_s": p99.as_secs_f64(),
        "gb_per_s": gbps, "tokens_per_s": tokens_per_s, "seconds_per_32k_handoff_extrapolated": s_per_32k,
        "latencies_s": latencies.iter().map(Duration::as_secs_f64).collect::<Vec<_>>(),
    });
    if opts.layerwise {
        let (whole, layered) = (median(&mut whole_tail), median(&mut layer_tail));
        println!(
            "layer-wise ({} layers, {} us compute each): last layer's submit -> landed {:.2} ms; whole request \
             after compute -> landed {:.2} ms",
            shape.layers,
            opts.layer_compute_us,
            layered.as_secs_f64() * 1e3,
            whole.as_secs_f64() * 1e3
        );
        row["layer_compute_us"] = json!(opts.layer_compute_us);
        row["layerwise_tail_p50_s"] = json!(layered.as_secs_f64());
        row["whole_after_compute_p50_s"] = json!(whole.as_secs_f64());
    }
    match opts.op {
        Op::Write => verify_last_write(ctx, &last)?,
        Op::Read => verify_last_read(ctx, &last)?,
    }
    Ok(vec![row])
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
    // In chunks: one control message must stay under the peer's notification bound.
    let mut remote = Vec::with_capacity(ranges.len());
    for chunk in ranges.chunks(2048) {
        remote.extend(ctx.remote_checksums(chunk)?);
    }
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
    fn pages_are_distinct_and_the_c_abi_plans_them() {
        let mut rng = fastrand::Rng::with_seed(1);
        let p = scattered_pages(&mut rng, 100, 50);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 50);
        let one = [KvBuffer { base: 0x1000, page_bytes: 16, pages: 100 }];
        let (_, n) = plan_through_c_abi(&one, &one, &[1, 2, 3, 7], &[10, 11, 5, 6]).unwrap();
        assert_eq!(n, 3);
    }
}
