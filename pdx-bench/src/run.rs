//! The block-size sweep: threads issuing batch calls of fixed-size blocks,
//! per-call latency, a progress bar, and byte-exact verification at the end.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use pdx::transfer::TransferBackend;
use pdx::transfer::{Direction, Notification, Request};

use crate::memory::Buffer;
use crate::report::{human_bytes, Row};
use crate::{pattern, InitiatorOpts, Op, CONTROL};

/// Seed of the initiator's source data (the target uses its own).
const SOURCE_SEED: u64 = 11;
/// Seed the target fills its buffer with.
pub const TARGET_SEED: u64 = 7;

pub struct Context<'a> {
    pub engine: &'a dyn TransferBackend,
    pub session: &'a str,
    pub remote_addr: u64,
    pub remote_len: usize,
    pub opts: &'a InitiatorOpts,
}

impl Context<'_> {
    pub fn direction(&self) -> Direction {
        match self.opts.op {
            Op::Write => Direction::Write,
            Op::Read => Direction::Read,
        }
    }

    /// Ask the target for checksums of `(offset, len)` ranges of its buffer.
    pub fn remote_checksums(&self, ranges: &[(usize, usize)]) -> Result<Vec<u64>, String> {
        let mut msg = format!("checksum {}", self.engine.session_id());
        for (o, l) in ranges {
            msg.push_str(&format!(" {o} {l}"));
        }
        self.engine
            .notify(self.session, &Notification::new(CONTROL, msg.as_str()))
            .map_err(|e| format!("checksum request: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            for note in self.engine.drain_notifications() {
                let reply = String::from_utf8_lossy(&note.msg);
                if let (true, Some(rest)) = (note.name == CONTROL.as_bytes(), reply.strip_prefix("checksums")) {
                    return rest
                        .split_whitespace()
                        .map(|h| u64::from_str_radix(h, 16).map_err(|_| format!("target answered {h:?}")))
                        .collect();
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Err("the target did not answer the checksum request within 120 s".into())
    }
}

/// Entries per call when `--batch` is 0: batches for small blocks (as KV
/// pages travel), single requests for large ones.
fn default_batch(block: usize) -> usize {
    match block {
        0..=65536 => 256,
        65537..=1048576 => 16,
        _ => 1,
    }
}

struct Progress {
    done: AtomicBool,
}

/// One `\r`-rewritten status line on stderr. A progress-bar crate (indicatif
/// and its dependencies) would buy nothing a single line needs.
fn progress_line(label: &str, bytes: &AtomicU64, goal: u64, started: Instant) -> String {
    let b = bytes.load(Ordering::Relaxed);
    let frac = (b as f64 / goal as f64).min(1.0);
    let filled = (frac * 30.0) as usize;
    format!(
        "\r{label:<22} [{}{}] {:>3.0}% {:>7.3} GB/s ",
        "#".repeat(filled),
        "-".repeat(30 - filled),
        frac * 100.0,
        b as f64 / started.elapsed().as_secs_f64().max(1e-9) / 1e9
    )
}

/// What the sweep moved, to be verified after the results are shown.
pub struct Moved {
    local: Buffer,
    region: usize,
    covered: Vec<usize>,
}

pub fn block_sweep(ctx: &Context<'_>) -> Result<(Vec<Row>, Moved), String> {
    let opts = ctx.opts;
    let threads = opts.threads.max(1);
    let region = (ctx.remote_len / threads) & !4095;
    if region == 0 {
        return Err("the target buffer is too small for that many threads".into());
    }
    let mut local =
        Buffer::with_pages(ctx.remote_len, opts.huge).map_err(|e| format!("cannot map the local buffer: {e}"))?;
    if opts.huge != crate::memory::Pages::Normal {
        println!("local buffer: {}", local.describe());
    }
    if opts.op == Op::Write {
        pattern::fill(local.as_mut_slice(), SOURCE_SEED);
    }
    // Device memory (`--location cuda:N`): the host buffer is its mirror,
    // uploaded before the sweep and read back before verifying.
    let dev = match crate::device::ordinal(&opts.location)? {
        Some(n) => {
            let d = crate::device::DeviceBuffer::new(n, local.len())?;
            d.upload(0, local.as_slice())?;
            let at = pdx::transfer::location::Requested::parse(&opts.location).map_err(|e| e.to_string())?;
            ctx.engine.register_batch_at(&[(d.addr(), d.len() as u64)], at).map_err(|e| e.to_string())?;
            Some(d)
        }
        None => None,
    };
    let local_addr = dev.as_ref().map_or(local.addr(), |d| d.addr()) as usize;
    let mut covered = vec![0usize; threads];
    let mut rows = Vec::new();
    let show = !opts.quiet && std::io::stderr().is_terminal();
    for &block in &opts.block {
        if block > region {
            eprintln!("skipping {}: larger than the per-thread buffer ({})", human_bytes(block), human_bytes(region));
            continue;
        }
        let batch = if opts.batch == 0 { default_batch(block) } else { opts.batch }.min(region / block).max(1);
        let slots = region / block; // blocks per thread region
        let label = format!("{} x{batch}", human_bytes(block));
        let moved = AtomicU64::new(0);
        let goal = opts.total as u64;
        let deadline_len = Duration::from_secs_f64(opts.duration.max(0.01));
        let barrier = Barrier::new(threads + 1);
        let progress = Progress { done: AtomicBool::new(false) };
        let mut failure = None;
        let mut per_thread: Vec<(usize, Vec<Duration>)> = Vec::new();
        let mut elapsed = Duration::ZERO;
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (moved, barrier) = (&moved, &barrier);
                    s.spawn(move || -> Result<(usize, Vec<Duration>), String> {
                        let base = t * region;
                        let call = |i: usize| -> Result<(), String> {
                            let reqs: Vec<Request> = (0..batch)
                                .map(|k| {
                                    let off = base + ((i * batch + k) % slots) * block;
                                    Request {
                                        local: local_addr + off,
                                        remote: ctx.remote_addr + off as u64,
                                        len: block,
                                    }
                                })
                                .collect();
                            // SAFETY: local ranges lie in `local`, alive for the scope.
                            unsafe { ctx.engine.transfer_sync(ctx.session, ctx.direction(), reqs) }
                                .map_err(|e| e.to_string())
                        };
                        let warm = call(0);
                        barrier.wait();
                        warm?;
                        let start = Instant::now();
                        let mut lat = Vec::new();
                        let mut i = 1;
                        while moved.load(Ordering::Relaxed) < goal && start.elapsed() < deadline_len {
                            let t0 = Instant::now();
                            call(i)?;
                            lat.push(t0.elapsed());
                            moved.fetch_add((batch * block) as u64, Ordering::Relaxed);
                            i += 1;
                        }
                        Ok((i * batch * block, lat))
                    })
                })
                .collect();
            barrier.wait();
            let started = Instant::now();
            if show {
                let (moved, progress, label) = (&moved, &progress, &label);
                s.spawn(move || {
                    while !progress.done.load(Ordering::Relaxed) {
                        eprint!("{}", progress_line(label, moved, goal, started));
                        let _ = std::io::stderr().flush();
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    eprint!("\r{:<80}\r", "");
                });
            }
            for h in handles {
                match h.join() {
                    Ok(Ok(r)) => per_thread.push(r),
                    Ok(Err(e)) => failure = Some(e),
                    Err(_) => failure = Some("a benchmark thread panicked".into()),
                }
            }
            elapsed = started.elapsed();
            progress.done.store(true, Ordering::Relaxed);
        });
        if let Some(e) = failure {
            return Err(format!("{label}: {e}"));
        }
        let mut latencies: Vec<Duration> = per_thread.iter().flat_map(|(_, l)| l.iter().copied()).collect();
        latencies.sort_unstable();
        for (t, (bytes, _)) in per_thread.iter().enumerate() {
            covered[t] = covered[t].max((*bytes).min(slots * block));
        }
        rows.push(Row {
            label: "blocks".into(),
            block,
            batch,
            threads,
            ops: latencies.len(),
            bytes: moved.load(Ordering::Relaxed),
            elapsed,
            latencies,
        });
    }
    if let Some(d) = dev {
        d.download(0, local.as_mut_slice())?;
        ctx.engine.unregister_batch(&[d.addr()]).map_err(|e| e.to_string())?;
    }
    Ok((rows, Moved { local, region, covered }))
}

/// Every byte the sweep moved must be where it belongs.
pub fn verify(ctx: &Context<'_>, moved: &Moved) -> Result<(), String> {
    let (local, region, covered) = (&moved.local, moved.region, &moved.covered);
    let ranges: Vec<(usize, usize)> =
        covered.iter().enumerate().filter(|(_, &c)| c > 0).map(|(t, &c)| (t * region, c)).collect();
    let total: usize = ranges.iter().map(|r| r.1).sum();
    match ctx.opts.op {
        Op::Write => {
            let remote = ctx.remote_checksums(&ranges)?;
            for ((off, len), sum) in ranges.iter().zip(&remote) {
                if pattern::checksum(&local.as_slice()[*off..off + len]) != *sum {
                    return Err(format!(
                        "verification failed: target bytes {off}..{} differ from what was sent",
                        off + len
                    ));
                }
            }
        }
        Op::Read => {
            for (off, len) in &ranges {
                if !pattern::matches_at(&local.as_slice()[*off..off + len], TARGET_SEED, *off) {
                    return Err(format!(
                        "verification failed: bytes read from {off}..{} differ from the target's",
                        off + len
                    ));
                }
            }
        }
    }
    println!("verified {} ({} bytes) byte for byte", human_bytes(total), total);
    Ok(())
}

/// The time one completed task's accounting takes in the native engine (the
/// counters, the latency quantiles, the latency and size histograms, the
/// queued gauge and the peer's own figures), averaged over many calls.
pub fn stats_cost() -> Duration {
    let stats = pdx::transfer::stats::Stats::default();
    const N: u32 = 1_000_000;
    let peer = stats.peers.entry("10.0.0.1:15000");
    stats.tasks_submitted(&peer, u64::from(N));
    let started = Instant::now();
    for i in 0..N {
        let took = Duration::from_micros(u64::from(i % 1000));
        stats.task_finished(&peer, Direction::Write, 4096, took, Ok(4096));
    }
    let per = started.elapsed() / N;
    std::hint::black_box(&stats);
    per
}
