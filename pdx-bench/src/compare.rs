//! `--compare-paths`: the same-host link against TCP loopback, the
//! mechanism's own limit and a memcpy, side by side in one run between the
//! same two processes.
//!
//! This process (the initiator) runs two engines against the one engine of
//! the target process it starts: one that may use the same-host link
//! (`same_host=auto`) and one that may not (`same_host=off`, so its data
//! connections stay on TCP loopback). The raw figure is measured by the
//! target process itself, on a control message, in the direction the link
//! copies: for a write it pulls the initiator's buffer into its registered
//! buffer with `process_vm_readv`, for a read it pushes into the
//! initiator's buffer with `process_vm_writev` (a batch as one call with
//! one iovec per block, at most IOV_MAX a call). memcpy is this process
//! copying the same blocks between two of its own buffers. Each round
//! measures every cell once, in turn; a cell's figure is its median call,
//! and the table shows the median over rounds.

use std::time::{Duration, Instant};

use pdx::config::engine_options::EngineOptions;
use pdx::transfer::{Direction, Notification, Request, TransferBackend};
use serde_json::{json, Value};

use crate::memory::Buffer;
use crate::report::human_bytes;
use crate::{pattern, InitiatorOpts, Op, CONTROL};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    SameHost,
    Tcp,
    Raw,
    Memcpy,
}

const METHODS: [Method; 4] = [Method::SameHost, Method::Tcp, Method::Raw, Method::Memcpy];

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::SameHost => "same-host",
            Method::Tcp => "tcp",
            Method::Raw => "raw process_vm",
            Method::Memcpy => "memcpy",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Method::SameHost => "same_host",
            Method::Tcp => "tcp",
            Method::Raw => "raw_process_vm",
            Method::Memcpy => "memcpy",
        }
    }
}

/// One row of the table: calls of `count` blocks of `block` bytes; shown
/// as throughput, or as the latency of one call (`latency`).
struct Workload {
    name: String,
    op: Op,
    block: usize,
    count: usize,
    latency: bool,
}

impl Workload {
    fn bytes(&self) -> usize {
        self.block * self.count
    }

    /// Calls timed per cell and round: at most, and at least (the time
    /// budget stops a cell between the two).
    fn calls(&self) -> (usize, usize) {
        match (self.latency, self.count) {
            (true, _) => (3000, 20),
            (false, 1) => (5, 1),
            (false, _) => (40, 3),
        }
    }

    /// The figure of a median call: GB/s, or microseconds.
    fn figure(&self, call: Duration) -> f64 {
        if self.latency {
            call.as_secs_f64() * 1e6
        } else {
            self.bytes() as f64 / call.as_secs_f64().max(1e-12) / 1e9
        }
    }

    fn unit(&self) -> &'static str {
        if self.latency {
            "us"
        } else {
            "GB/s"
        }
    }

    /// How many times faster figure `a` is than `b`.
    fn speedup(&self, a: f64, b: f64) -> f64 {
        if self.latency {
            b / a.max(1e-12)
        } else {
            a / b.max(1e-12)
        }
    }

    fn requests(&self, local: u64, remote: u64) -> Vec<Request> {
        (0..self.count)
            .map(|i| Request {
                local: (local as usize) + i * self.block,
                remote: remote + (i * self.block) as u64,
                len: self.block,
            })
            .collect()
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Write => "write",
        Op::Read => "read",
    }
}

fn workloads(opts: &InitiatorOpts) -> Vec<Workload> {
    let mut w = Vec::new();
    let batch = opts.compare_batch.max(1);
    for op in [Op::Write, Op::Read] {
        let name = format!("{} {}", human_bytes(opts.compare_large), op_name(op));
        w.push(Workload { name, op, block: opts.compare_large, count: 1, latency: false });
    }
    for op in [Op::Write, Op::Read] {
        let name = format!("{} x {batch} {}", human_bytes(opts.compare_block), op_name(op));
        w.push(Workload { name, op, block: opts.compare_block, count: batch, latency: false });
    }
    for op in [Op::Write, Op::Read] {
        let name = format!("{} {} p50", human_bytes(opts.compare_small), op_name(op));
        w.push(Workload { name, op, block: opts.compare_small, count: 1, latency: true });
    }
    w
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Warm up with one call, then time calls until `most` of them, or
/// `budget` once `least` ran; the median call.
fn time_calls(
    (most, least): (usize, usize),
    budget: Duration,
    mut call: impl FnMut() -> Result<(), String>,
) -> Result<Duration, String> {
    call()?;
    let started = Instant::now();
    let mut times = Vec::new();
    while times.len() < most && (times.len() < least || started.elapsed() < budget) {
        let t0 = Instant::now();
        call()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(Duration::from_secs_f64(median(times)))
}

/// Send a control message to the target and wait for the answer that
/// starts with `answer` (the rest of it).
fn control(engine: &dyn TransferBackend, session: &str, msg: &str, answer: &str) -> Result<String, String> {
    engine
        .notify(session, &Notification::new(CONTROL, msg))
        .map_err(|e| format!("control message to the target: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        for note in engine.drain_notifications() {
            if note.name != CONTROL.as_bytes() {
                continue;
            }
            let reply = String::from_utf8_lossy(&note.msg);
            if let Some(rest) = reply.strip_prefix(answer) {
                return Ok(rest.trim().to_owned());
            }
            if let Some(why) = reply.strip_prefix("pvm-failed") {
                return Err(format!("the target's raw copy failed: {}", why.trim()));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(format!("the target did not answer {msg:?} within 300 s"))
}

/// The Yama LSM's `ptrace_scope`, where the LSM is there.
fn yama_scope() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok()?.trim().parse().ok()
}

struct Setup<'a> {
    same_host: &'a dyn TransferBackend,
    tcp: &'a dyn TransferBackend,
    session: &'a str,
    remote_addr: u64,
    local: &'a mut Buffer,
    scratch: &'a mut Buffer,
    budget: Duration,
    /// Threads the target splits a raw throughput copy across.
    raw_threads: usize,
}

impl Setup<'_> {
    /// One cell: the median call of `w` by `m`.
    fn measure(&mut self, w: &Workload, m: Method) -> Result<Duration, String> {
        let direction = match w.op {
            Op::Write => Direction::Write,
            Op::Read => Direction::Read,
        };
        let (session, remote, local_addr, budget) = (self.session, self.remote_addr, self.local.addr(), self.budget);
        match m {
            Method::SameHost | Method::Tcp => {
                let engine = if m == Method::SameHost { self.same_host } else { self.tcp };
                time_calls(w.calls(), budget, || {
                    // SAFETY: every local range lies in `self.local`, alive and not otherwise used meanwhile.
                    unsafe { engine.transfer_sync(session, direction, w.requests(local_addr, remote)) }
                        .map_err(|e| format!("{} {}: {e}", m.name(), w.name))
                })
            }
            Method::Raw => {
                let (most, least) = w.calls();
                let threads = if w.latency { 1 } else { self.raw_threads };
                let msg = format!(
                    "pvm {} {} {} {} {} {} {most} {least} {} {threads}",
                    self.same_host.session_id(),
                    std::process::id(),
                    op_name(w.op),
                    local_addr,
                    w.block,
                    w.count,
                    budget.as_millis()
                );
                let ns = control(self.same_host, session, &msg, "pvm-done")?;
                ns.parse::<u64>().map(Duration::from_nanos).map_err(|_| format!("the target answered {ns:?}"))
            }
            Method::Memcpy => {
                let (block, count) = (w.block, w.count);
                let (local, scratch) = (&mut *self.local, &mut *self.scratch);
                time_calls(w.calls(), budget, || {
                    for i in 0..count {
                        let r = i * block..(i + 1) * block;
                        match w.op {
                            Op::Write => scratch.as_mut_slice()[r.clone()].copy_from_slice(&local.as_slice()[r]),
                            Op::Read => local.as_mut_slice()[r.clone()].copy_from_slice(&scratch.as_slice()[r]),
                        }
                    }
                    std::hint::black_box((&*local, &*scratch));
                    Ok(())
                })
            }
        }
    }
}

/// Run the comparison (loopback mode with `--compare-paths`).
pub fn run(opts: &InitiatorOpts) -> Result<(), String> {
    if opts.protocol != "tcp" {
        return Err("--compare-paths compares the paths of pdx's own engine: use --protocol tcp".into());
    }
    if crate::device::ordinal(&opts.location)?.is_some() || crate::device::ordinal(&opts.remote_location)?.is_some() {
        return Err("--compare-paths measures host memory: leave --location and --remote-location at cpu".into());
    }
    let workloads = workloads(opts);
    let need = workloads.iter().map(Workload::bytes).max().unwrap_or(4096).div_ceil(4096) * 4096;
    let rounds = opts.rounds.max(1);
    let budget = Duration::from_secs_f64(opts.duration.max(0.001));
    // Both sides on the link where it can be had, whatever the environment says.
    let mut target = crate::spawn_target(opts, need, &[("PDX_SAME_HOST", "auto")], &["--raw-copies-with-parent"])?;
    let result = (|| {
        if yama_scope() == Some(1) {
            // The raw copies are the target's, as the link's are: let that one process (only) copy our memory.
            // SAFETY: prctl with PR_SET_PTRACER takes a pid and touches no memory of ours.
            unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::c_ulong::from(target.child.id()), 0, 0, 0) };
        }
        let start = |same_host: &str| {
            let mut o = EngineOptions::new();
            o.set("same_host", Some(same_host)).map_err(|e| e.to_string())?;
            pdx::backend::start_with(&opts.host, Some(&opts.protocol), None, &o)
                .map(|(engine, _)| engine)
                .map_err(|e| e.to_string())
        };
        let same_host = start("auto")?;
        let tcp = start("off")?;
        let mut local = Buffer::with_pages(need, opts.huge).map_err(|e| format!("cannot map the local buffer: {e}"))?;
        let mut scratch =
            Buffer::with_pages(need, opts.huge).map_err(|e| format!("cannot map the memcpy buffer: {e}"))?;
        pattern::fill(local.as_mut_slice(), crate::run::TARGET_SEED + 1);
        pattern::fill(scratch.as_mut_slice(), crate::run::TARGET_SEED + 2);
        println!(
            "comparing paths to {} ({}; {rounds} rounds of {} cells, at most {:.2} s a cell)",
            target.session,
            crate::report::human_bytes(need),
            workloads.len() * METHODS.len(),
            budget.as_secs_f64()
        );
        println!("pages: local {}; memcpy buffer {}; target {}", local.describe(), scratch.describe(), target.pages);
        let mut setup = Setup {
            same_host: same_host.as_ref(),
            tcp: tcp.as_ref(),
            session: &target.session,
            remote_addr: target.addr,
            local: &mut local,
            scratch: &mut scratch,
            budget,
            raw_threads: opts.raw_threads.max(1),
        };
        // figures[workload][method] per round.
        let mut figures = vec![vec![Vec::new(); METHODS.len()]; workloads.len()];
        for round in 0..rounds {
            for (wi, w) in workloads.iter().enumerate() {
                for (mi, &m) in METHODS.iter().enumerate() {
                    let call = setup.measure(w, m)?;
                    figures[wi][mi].push(w.figure(call));
                }
            }
            if !opts.quiet {
                eprintln!("round {} of {rounds} done", round + 1);
            }
        }
        let verified = verify(&mut setup, opts, target.len)?;
        let paths =
            [paths_json(same_host.as_ref(), &target.session, "auto"), paths_json(tcp.as_ref(), &target.session, "tcp")];
        let table = print_table(&workloads, &figures, rounds, opts);
        let json = json!({
            "mode": "compare-paths", "rounds": rounds, "raw_threads": opts.raw_threads.max(1), "pages": opts.huge.name(), "cell_seconds": budget.as_secs_f64(),
            "target_pages": target.pages, "local_pages": setup.local.describe(),
            "rows": table.0, "goals": table.1, "verified_bytes": verified,
            "paths": {"same_host_engine": paths[0], "tcp_engine": paths[1]},
        });
        if let Some(path) = &opts.json {
            std::fs::write(path, serde_json::to_string_pretty(&json).unwrap_or_default())
                .map_err(|e| format!("cannot write {path}: {e}"))?;
        }
        Ok(())
    })();
    target.stop();
    result
}

/// Which path an engine's data took, its same-host bytes, as JSON (and printed).
fn paths_json(engine: &dyn TransferBackend, session: &str, requested: &str) -> Value {
    let path = crate::peer_path(engine, session);
    path.print(session, requested);
    let info = engine.peer_info(session).unwrap_or(Value::Null);
    json!({
        "requested": requested, "path": path.taken, "reason": path.reason,
        "same_host_bytes_written": info["same_host_bytes_written"], "same_host_bytes_read": info["same_host_bytes_read"],
        "bytes_written": info["bytes_written"], "bytes_read": info["bytes_read"],
    })
}

/// Each pdx path moves the large size byte for byte both ways (a
/// benchmark of a path that moves wrong bytes would mean nothing); the
/// bytes checked.
fn verify(s: &mut Setup<'_>, opts: &InitiatorOpts, remote_len: usize) -> Result<usize, String> {
    let len = opts.compare_large;
    let ctx =
        crate::run::Context { engine: s.same_host, session: s.session, remote_addr: s.remote_addr, remote_len, opts };
    let req = [Request { local: s.local.addr() as usize, remote: s.remote_addr, len }];
    for (seed, engine, name) in [(31, s.same_host, "same-host"), (32, s.tcp, "tcp")] {
        pattern::fill(&mut s.local.as_mut_slice()[..len], seed);
        // SAFETY: the range lies in `s.local`, alive and not otherwise used meanwhile.
        unsafe { engine.transfer_sync(s.session, Direction::Write, req.to_vec()) }.map_err(|e| e.to_string())?;
        let theirs = ctx.remote_checksums(&[(0, len)])?;
        if theirs.first() != Some(&pattern::checksum(&s.local.as_slice()[..len])) {
            return Err(format!("verification failed: the {name} write left other bytes in the target"));
        }
        s.local.as_mut_slice()[..len].fill(0);
        // SAFETY: as above.
        unsafe { engine.transfer_sync(s.session, Direction::Read, req.to_vec()) }.map_err(|e| e.to_string())?;
        if !pattern::matches_at(&s.local.as_slice()[..len], seed, 0) {
            return Err(format!("verification failed: the {name} read brought other bytes than the target's"));
        }
    }
    println!("verified: same-host and tcp each wrote and read back {} byte for byte", human_bytes(len));
    Ok(len)
}

fn format_figure(w: &Workload, v: f64) -> String {
    if w.latency && v < 10.0 {
        format!("{v:.2} us")
    } else if w.latency {
        format!("{v:.1} us")
    } else {
        format!("{v:.2} GB/s")
    }
}

/// Print the table and the goals; both as JSON.
fn print_table(
    workloads: &[Workload],
    figures: &[Vec<Vec<f64>>],
    rounds: usize,
    opts: &InitiatorOpts,
) -> (Value, Value) {
    let med: Vec<Vec<f64>> = figures.iter().map(|row| row.iter().map(|v| median(v.clone())).collect()).collect();
    println!(
        "\nsame-host link vs TCP loopback vs raw process_vm_readv/writev (by the target, {} thread{}) vs memcpy \
         ({} pages; median of {rounds} rounds; ratios: how many times faster same-host is)",
        opts.raw_threads.max(1),
        if opts.raw_threads > 1 { "s" } else { "" },
        opts.huge.name()
    );
    println!(
        "{:<22} {:>14} {:>14} {:>16} {:>14} {:>8} {:>8}",
        "workload", "same-host", "tcp", "raw process_vm", "memcpy", "sh/raw", "sh/tcp"
    );
    let (sh, tcp, raw) = (0, 1, 2);
    let mut rows = Vec::new();
    for (w, m) in workloads.iter().zip(&med) {
        println!(
            "{:<22} {:>14} {:>14} {:>16} {:>14} {:>8.2} {:>8.2}",
            w.name,
            format_figure(w, m[0]),
            format_figure(w, m[1]),
            format_figure(w, m[2]),
            format_figure(w, m[3]),
            w.speedup(m[sh], m[raw]),
            w.speedup(m[sh], m[tcp])
        );
        let mut row = json!({
            "workload": w.name, "op": op_name(w.op), "block_bytes": w.block, "blocks_per_call": w.count,
            "unit": w.unit(), "same_host_vs_raw": w.speedup(m[sh], m[raw]), "same_host_vs_tcp": w.speedup(m[sh], m[tcp]),
        });
        for (i, method) in METHODS.iter().enumerate() {
            row[method.key()] = json!(m[i]);
            row[format!("{}_per_round", method.key())] = json!(figures[rows.len()][i]);
        }
        rows.push(row);
    }
    // The goals, reported (not enforced).
    let mut goals = Vec::new();
    let mut goal = |what: String, value: f64, bound: f64, met: bool| {
        println!("  {} {what}: {value:.3} against {bound:.3}", if met { "met   " } else { "MISSED" });
        goals.push(json!({"goal": what, "value": value, "bound": bound, "met": met}));
    };
    println!("goals (reported, not enforced):");
    let large: Vec<usize> =
        (0..workloads.len()).filter(|&i| !workloads[i].latency && workloads[i].count == 1).collect();
    let fastest_raw = large.iter().map(|&i| med[i][raw]).fold(0.0, f64::max);
    for &i in &large {
        let w = &workloads[i];
        goal(
            format!("{} same-host >= 0.85 x the faster raw copy (GB/s)", w.name),
            med[i][sh],
            0.85 * fastest_raw,
            med[i][sh] >= 0.85 * fastest_raw,
        );
        goal(
            format!("{} same-host >= 1.1 x tcp (GB/s)", w.name),
            med[i][sh],
            1.1 * med[i][tcp],
            med[i][sh] >= 1.1 * med[i][tcp],
        );
    }
    for (i, w) in workloads.iter().enumerate() {
        if w.latency {
            goal(format!("{} same-host below tcp (us)", w.name), med[i][sh], med[i][tcp], med[i][sh] < med[i][tcp]);
        } else if w.count > 1 {
            goal(
                format!("{} same-host >= 1.2 x tcp (GB/s)", w.name),
                med[i][sh],
                1.2 * med[i][tcp],
                med[i][sh] >= 1.2 * med[i][tcp],
            );
        }
    }
    (Value::Array(rows), Value::Array(goals))
}

/// The target's side of a raw copy: `args` of a `pvm` control message
/// (`pid op initiator_addr block count most least budget_ms threads`);
/// copies `count` blocks between offset 0 of `buf` and the initiator's
/// memory as the link would (write: pull with process_vm_readv; read: push
/// with process_vm_writev), one call per IOV_MAX blocks, the blocks (or
/// one block's bytes) split across `threads` threads; times the calls as
/// [`time_calls`] does, and answers `pvm-done <median ns>` or
/// `pvm-failed <why>`.
pub fn serve_raw_copy(buf: &mut Buffer, args: &[&str]) -> String {
    match raw_copies(buf, args) {
        Ok(ns) => format!("pvm-done {ns}"),
        Err(e) => format!("pvm-failed {e}"),
    }
}

/// One contiguous copy: our address, theirs, length.
type Segment = (usize, u64, usize);

fn raw_copies(buf: &mut Buffer, args: &[&str]) -> Result<u64, String> {
    let num = |i: usize| -> Result<u64, String> {
        args.get(i).and_then(|a| a.parse::<u64>().ok()).ok_or_else(|| format!("bad argument {i} in {args:?}"))
    };
    let pid = libc::pid_t::try_from(num(0)?).map_err(|_| "bad pid".to_owned())?;
    let pull = match args.get(1) {
        Some(&"write") => true,
        Some(&"read") => false,
        _ => return Err(format!("bad op in {args:?}")),
    };
    let (theirs, block, count) = (num(2)?, num(3)? as usize, num(4)? as usize);
    let (most, least, budget) = (num(5)? as usize, num(6)? as usize, Duration::from_millis(num(7)?));
    let threads = (num(8)? as usize).clamp(1, 64);
    if block == 0 || count == 0 || count > 1 << 20 || block.checked_mul(count).is_none_or(|n| n > buf.len()) {
        return Err(format!("{count} blocks of {block} bytes do not fit the {} byte buffer", buf.len()));
    }
    let ours = buf.as_mut_slice().as_mut_ptr() as usize;
    let segments: Vec<Segment> = if count == 1 {
        // One block: its bytes in page-aligned pieces, one a thread.
        let piece = block.div_ceil(threads).div_ceil(4096) * 4096;
        (0..block).step_by(piece).map(|o| (ours + o, theirs + o as u64, piece.min(block - o))).collect()
    } else {
        (0..count).map(|i| (ours + i * block, theirs + (i * block) as u64, block)).collect()
    };
    let per_thread = segments.len().div_ceil(threads);
    let groups: Vec<&[Segment]> = segments.chunks(per_thread).collect();
    let call = || -> Result<(), String> {
        if let [one] = groups.as_slice() {
            return copy_segments(pid, pull, one);
        }
        std::thread::scope(|s| {
            let running: Vec<_> = groups.iter().map(|g| s.spawn(move || copy_segments(pid, pull, g))).collect();
            running.into_iter().try_for_each(|t| t.join().map_err(|_| "a copy thread panicked".to_owned())?)
        })
    };
    let median = time_calls((most.max(1), least.clamp(1, most.max(1))), budget, call)?;
    Ok(u64::try_from(median.as_nanos()).unwrap_or(u64::MAX))
}

/// Copy `segments` (ours inside the served buffer, checked by the caller;
/// theirs checked by the kernel) with as few calls as IOV_MAX allows.
fn copy_segments(pid: libc::pid_t, pull: bool, segments: &[Segment]) -> Result<(), String> {
    const IOV_MAX: usize = 1024;
    let iov = |addr: usize, len: usize| libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
    for chunk in segments.chunks(IOV_MAX) {
        let want: usize = chunk.iter().map(|s| s.2).sum();
        let mut done = 0;
        while done < want {
            // A short copy only happens at a fault; one segment resumes where it stopped.
            let (local, remote): (Vec<libc::iovec>, Vec<libc::iovec>) = match chunk {
                _ if done == 0 => chunk.iter().map(|&(o, t, l)| (iov(o, l), iov(t as usize, l))).unzip(),
                [(o, t, _)] => (vec![iov(o + done, want - done)], vec![iov(*t as usize + done, want - done)]),
                _ => return Err(format!("a short copy ({done} of {want} bytes)")),
            };
            // SAFETY: the local iovecs lie in the served buffer (checked by the caller), alive
            // while the target serves; the remote ones are checked by the kernel (EFAULT).
            let n = unsafe {
                if pull {
                    libc::process_vm_readv(pid, local.as_ptr(), local.len() as _, remote.as_ptr(), remote.len() as _, 0)
                } else {
                    libc::process_vm_writev(
                        pid,
                        local.as_ptr(),
                        local.len() as _,
                        remote.as_ptr(),
                        remote.len() as _,
                        0,
                    )
                }
            };
            if n <= 0 {
                let call = if pull { "process_vm_readv" } else { "process_vm_writev" };
                return Err(format!("{call}: {}", std::io::Error::last_os_error()));
            }
            done += n as usize;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_speedups() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let thr = Workload { name: String::new(), op: Op::Write, block: 1000, count: 2, latency: false };
        assert_eq!(thr.figure(Duration::from_micros(1)), 2.0);
        assert_eq!(thr.speedup(4.0, 2.0), 2.0);
        let lat = Workload { latency: true, ..thr };
        assert_eq!(lat.speedup(10.0, 20.0), 2.0);
    }

    #[test]
    fn raw_copies_within_this_process() {
        let mut theirs = Buffer::with_pages(1 << 16, crate::memory::Pages::Normal).unwrap();
        pattern::fill(theirs.as_mut_slice(), 5);
        let mut ours = Buffer::with_pages(1 << 16, crate::memory::Pages::Normal).unwrap();
        let pid = std::process::id().to_string();
        let addr = theirs.addr().to_string();
        let answer = serve_raw_copy(&mut ours, &[&pid, "write", &addr, "4096", "16", "3", "1", "10", "1"]);
        assert!(answer.starts_with("pvm-done "), "{answer}");
        assert!(pattern::matches_at(ours.as_slice(), 5, 0));
        // Pushed back in three threads' pieces, one block (the last piece shorter).
        pattern::fill(ours.as_mut_slice(), 6);
        let answer = serve_raw_copy(&mut ours, &[&pid, "read", &addr, "65536", "1", "2", "1", "10", "3"]);
        assert!(answer.starts_with("pvm-done "), "{answer}");
        assert!(pattern::matches_at(theirs.as_slice(), 6, 0));
        let too_big = serve_raw_copy(&mut ours, &[&pid, "read", &addr, "4096", "17", "3", "1", "10", "1"]);
        assert!(too_big.starts_with("pvm-failed") && too_big.contains("do not fit"), "{too_big}");
    }
}
