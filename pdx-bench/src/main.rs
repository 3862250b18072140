//! pdx-bench: throughput and latency of pdx transfers.
//!
//! `pdx-bench` (loopback mode, the default) starts a target process and
//! measures from this process; `target` and `initiator` run the two sides on
//! two hosts. Control messages (checksums, quit) travel as pdx
//! notifications, so the two sides need nothing but the session name.

#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod compare;
mod device;
mod kv;
mod memory;
mod pattern;
mod report;
mod run;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use pdx::transfer::{Notification, TransferBackend};

use memory::{Buffer, Pages};

#[derive(Parser)]
#[command(name = "pdx-bench", about = "Measure pdx transfer throughput and latency", version)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[command(flatten)]
    opts: InitiatorOpts,
}

#[derive(Subcommand)]
enum Mode {
    /// Start a target here and measure against it from a second process (default).
    Loopback(InitiatorOpts),
    /// Serve a buffer for an initiator; prints one JSON line with the session.
    Target(TargetOpts),
    /// Measure against a running target.
    Initiator {
        /// The target's session (`host:port`), as printed by `pdx-bench target`.
        #[arg(long)]
        session: String,
        /// Address of the target's buffer (printed by the target).
        #[arg(long)]
        remote_addr: u64,
        /// Length of the target's buffer.
        #[arg(long)]
        remote_len: usize,
        #[command(flatten)]
        opts: InitiatorOpts,
    },
}

#[derive(Args, Clone)]
struct TargetOpts {
    /// Hostname to serve on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Size of the served buffer.
    #[arg(long, default_value = "1G", value_parser = report::parse_bytes)]
    buffer: usize,
    /// Seed of the data the buffer is filled with (for read checks).
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Transport protocol (tcp runs the native engine; others Mooncake's).
    #[arg(long, default_value = "tcp")]
    protocol: String,
    /// Where peers find each other (PDX_METADATA_SERVER): P2PHANDSHAKE,
    /// http://host:port/metadata, etcd://h:p[,h:p] (`;` also separates
    /// endpoints) or a bare h:p (etcd).
    #[arg(long)]
    metadata: Option<String>,
    /// Where the served buffer lives: cpu:N, or cuda:N (device memory from
    /// the driver in PDX_CUDA_LIB).
    #[arg(long, default_value = "cpu:0")]
    location: String,
    /// What pages back the served buffer (host memory).
    #[arg(long, value_enum, default_value = "normal")]
    huge: Pages,
    /// Do raw cross-process copies with the parent process's memory when
    /// it asks (set by `--compare-paths`; with no other process).
    #[arg(long, hide = true)]
    raw_copies_with_parent: bool,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum Op {
    Write,
    Read,
}

/// Which data path to let the engines take between two processes on one host.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum PathArg {
    /// The engines' choice: the same-host link where it works, else TCP.
    Auto,
    /// TCP (loopback) only: PDX_SAME_HOST=off for this process and the
    /// target it starts.
    Tcp,
}

impl PathArg {
    fn name(self) -> &'static str {
        match self {
            PathArg::Auto => "auto",
            PathArg::Tcp => "tcp",
        }
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum Workload {
    /// Block-size sweep.
    Blocks,
    /// KV-cache handoffs shaped like SGLang's (pages from every layer).
    Kv,
    /// Both.
    All,
}

#[derive(Args, Clone)]
struct InitiatorOpts {
    /// Operation.
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// Block sizes to sweep (comma list).
    #[arg(long, value_delimiter = ',', default_values = ["4K", "64K", "1M", "16M", "64M"], value_parser = report::parse_bytes)]
    block: Vec<usize>,
    /// Entries per batch call: 0 (the default) picks by block size (256 up
    /// to 64 KiB, as KV pages travel; 16 up to 1 MiB; single requests
    /// above); 1 = single requests.
    #[arg(long, default_value_t = 0)]
    batch: usize,
    /// Bytes to move per block size (the run stops at this or --duration).
    #[arg(long, default_value = "1G", value_parser = report::parse_bytes)]
    total: usize,
    /// Seconds per block size at most.
    #[arg(long, default_value_t = 2.0)]
    duration: f64,
    /// Threads issuing calls concurrently.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Data connections per peer (PDX_TCP_LANES).
    #[arg(long)]
    lanes: Option<usize>,
    /// Transport protocol (tcp runs the native engine; rdma, efa, ... run
    /// Mooncake's, see PDX_MOONCAKE_LIB).
    #[arg(long, default_value = "tcp")]
    protocol: String,
    /// Where peers find each other (PDX_METADATA_SERVER): P2PHANDSHAKE,
    /// http://host:port/metadata, etcd://host:port or host:port (etcd);
    /// the loopback target uses the same.
    #[arg(long)]
    metadata: Option<String>,
    /// Hostname of the initiator engine (and of the target in loopback mode).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Size of the target buffer in loopback mode.
    #[arg(long, default_value = "1G", value_parser = report::parse_bytes)]
    buffer: usize,
    /// Which workload to run.
    #[arg(long, value_enum, default_value = "all")]
    workload: Workload,
    /// KV workload: model shape (qwen3-8b, llama3-8b, llama3-70b).
    #[arg(long, default_value = "qwen3-8b")]
    kv_model: String,
    /// KV workload: tokens per handoff.
    #[arg(long, default_value_t = 2048)]
    kv_tokens: usize,
    /// KV workload: tokens per page.
    #[arg(long, default_value_t = 16)]
    kv_page_tokens: usize,
    /// KV workload: handoffs to time.
    #[arg(long, default_value_t = 5)]
    kv_handoffs: usize,
    /// KV workload: also send each handoff layer by layer as the (simulated)
    /// prefill computes it, and compare with one transfer after compute.
    #[arg(long)]
    layerwise: bool,
    /// KV workload with --layerwise: simulated compute time per layer.
    #[arg(long, default_value_t = 1000)]
    layer_compute_us: u64,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<String>,
    /// Write an SVG plot of GB/s against block size to this file.
    #[arg(long)]
    plot: Option<String>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Where the initiator's buffer lives: cpu:N, or cuda:N (device memory
    /// from the driver in PDX_CUDA_LIB, staged by pdx).
    #[arg(long, default_value = "cpu:0")]
    location: String,
    /// Loopback mode: where the target's buffer lives (cpu:N or cuda:N).
    #[arg(long, default_value = "cpu:0")]
    remote_location: String,
    /// With device memory on either side, first run the same sweep with
    /// host memory on both and print the two side by side.
    #[arg(long)]
    compare_host: bool,
    /// Data path between the two processes (auto: the same-host link where
    /// the engines can use it; tcp: PDX_SAME_HOST=off on both sides). The
    /// path taken and why is printed after the run.
    #[arg(long, value_enum, default_value = "auto")]
    path: PathArg,
    /// What pages back the host buffers on both sides: normal (4 KiB),
    /// thp (madvise(MADV_HUGEPAGE)) or hugetlb (MAP_HUGETLB, from vm.nr_hugepages).
    #[arg(long, value_enum, default_value = "normal")]
    huge: Pages,
    /// Loopback mode: measure the same-host link, TCP loopback, a raw
    /// process_vm_readv/writev and a memcpy side by side (interleaved
    /// rounds; host memory) instead of the sweep. The workloads: one large
    /// request, a batch of small blocks, a small synchronous request.
    #[arg(long, conflicts_with = "path")]
    compare_paths: bool,
    /// --compare-paths: size of the single large request.
    #[arg(long, default_value = "256M", value_parser = report::parse_bytes)]
    compare_large: usize,
    /// --compare-paths: block size of the batch.
    #[arg(long, default_value = "64K", value_parser = report::parse_bytes)]
    compare_block: usize,
    /// --compare-paths: blocks per batch.
    #[arg(long, default_value_t = 256)]
    compare_batch: usize,
    /// --compare-paths: size of the synchronous request whose p50 latency is shown.
    #[arg(long, default_value = "4K", value_parser = report::parse_bytes)]
    compare_small: usize,
    /// --compare-paths: rounds (each measures every cell once; medians shown).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// --compare-paths: threads the target splits each raw throughput copy
    /// across (1: one process_vm_* call per request, or per IOV_MAX blocks).
    #[arg(long, default_value_t = 1)]
    raw_threads: usize,
}

fn main() {
    let cli = Cli::parse();
    let lanes = match &cli.mode {
        None => cli.opts.lanes,
        Some(Mode::Loopback(o)) | Some(Mode::Initiator { opts: o, .. }) => o.lanes,
        Some(Mode::Target(_)) => None,
    };
    if let Some(l) = lanes {
        // Read by the engine when it starts; set before any thread exists.
        std::env::set_var("PDX_TCP_LANES", l.clamp(1, 64).to_string());
    }
    let path = match &cli.mode {
        None => cli.opts.path,
        Some(Mode::Loopback(o)) | Some(Mode::Initiator { opts: o, .. }) => o.path,
        Some(Mode::Target(_)) => PathArg::Auto,
    };
    let metadata = match &cli.mode {
        None => cli.opts.metadata.clone(),
        Some(Mode::Loopback(o)) | Some(Mode::Initiator { opts: o, .. }) => o.metadata.clone(),
        Some(Mode::Target(t)) => t.metadata.clone(),
    };
    if let Some(m) = metadata {
        let _ = THROUGH_STORE.set(!matches!(m.trim(), "" | "P2PHANDSHAKE"));
        // Read by the engine when it starts; the loopback target inherits it.
        std::env::set_var("PDX_METADATA_SERVER", m);
    }
    if path == PathArg::Tcp {
        // As above; the loopback target inherits it.
        std::env::set_var("PDX_SAME_HOST", "off");
    }
    let result = match cli.mode {
        None => loopback(cli.opts),
        Some(Mode::Loopback(opts)) => loopback(opts),
        Some(Mode::Target(t)) => target(t),
        Some(Mode::Initiator { session, remote_addr, remote_len, opts }) => {
            initiator(&opts, &session, remote_addr, remote_len).map(|_| ())
        }
    };
    if let Err(e) = result {
        eprintln!("pdx-bench: {e}");
        std::process::exit(1);
    }
}

/// Whether `--metadata` names a metadata server (not P2P handshake).
static THROUGH_STORE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn start_engine(host: &str, protocol: &str) -> Result<Box<dyn TransferBackend>, String> {
    // Through a metadata server a segment is named as given: a name without
    // a port gets one from the process id, so that the loopback target and
    // initiator on one host do not claim the same name.
    let through_store = THROUGH_STORE.get().copied().unwrap_or(false);
    let name = match through_store && !host.contains(':') {
        true => format!("{host}:{}", 1024 + std::process::id() % 60000),
        false => host.to_owned(),
    };
    pdx::backend::start(&name, Some(protocol), None).map_err(|e| e.to_string())
}

/// The metadata string the engine runs through, as it describes it.
fn metadata_mode(engine: &dyn TransferBackend) -> String {
    let own = engine.peer_info(engine.session_id()).ok();
    let mode = own.as_ref().and_then(|v| v["directory"]["metadata"].as_str().map(str::to_owned));
    mode.unwrap_or_else(|| "P2PHANDSHAKE".to_owned())
}

/// How the engine finds peers, in words.
fn found_how(engine: &dyn TransferBackend) -> &'static str {
    match metadata_mode(engine) {
        m if m == "P2PHANDSHAKE" => "by asking each peer on its handshake port",
        m if m.starts_with("http://") => "through Mooncake's HTTP metadata server",
        _ => "through etcd",
    }
}

/// Control messages ride on pdx notifications with this name.
const CONTROL: &str = "pdx-bench";

fn target(opts: TargetOpts) -> Result<(), String> {
    let engine = start_engine(&opts.host, &opts.protocol)?;
    let mut buf =
        Buffer::with_pages(opts.buffer, opts.huge).map_err(|e| format!("cannot map {} bytes: {e}", opts.buffer))?;
    pattern::fill(buf.as_mut_slice(), opts.seed);
    // Device memory: the pattern is uploaded, and checksums read it back.
    let dev = match device::ordinal(&opts.location)? {
        Some(n) => {
            let d = device::DeviceBuffer::new(n, buf.len())?;
            d.upload(0, buf.as_slice())?;
            Some(d)
        }
        None => None,
    };
    let served = dev.as_ref().map_or(buf.addr(), |d| d.addr());
    let at = pdx::transfer::location::Requested::parse(&opts.location).map_err(|e| e.to_string())?;
    engine.register_batch_at(&[(served, buf.len() as u64)], at).map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::json!({"session": engine.session_id(), "addr": served, "len": buf.len(), "seed": opts.seed,
                           "pages": buf.describe()})
    );
    // Serve control requests until told to quit, stdin closes (the loopback
    // parent holds it), or the parent goes away.
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let stdin_closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stdin_closed.clone();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while matches!(std::io::stdin().read_line(&mut sink), Ok(n) if n > 0) {
            sink.clear();
        }
        flag.store(true, std::sync::atomic::Ordering::Release);
    });
    loop {
        if stdin_closed.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        for note in engine.drain_notifications() {
            if note.name != CONTROL.as_bytes() {
                continue;
            }
            let msg = String::from_utf8_lossy(&note.msg);
            let words: Vec<&str> = msg.split_whitespace().collect();
            match words.as_slice() {
                ["quit"] => return Ok(()),
                ["pvm", reply, args @ ..] => {
                    // Only the loopback parent, and only when it asked for this at the start: a
                    // control message must not make a target copy another process's memory.
                    let answer = match args.first().and_then(|p| p.parse::<i32>().ok()) {
                        Some(pid) if opts.raw_copies_with_parent && pid == parent => {
                            compare::serve_raw_copy(&mut buf, args)
                        }
                        _ => "pvm-failed raw copies are only for the --compare-paths parent".to_owned(),
                    };
                    if let Err(e) = engine.notify(reply, &Notification::new(CONTROL, answer.as_str())) {
                        eprintln!("pdx-bench target: cannot answer {reply}: {e}");
                    }
                }
                ["checksum", reply, ranges @ ..] => {
                    let mut sums = Vec::new();
                    for pair in ranges.chunks(2) {
                        let (off, len) = match pair {
                            [o, l] => (o.parse::<usize>().unwrap_or(usize::MAX), l.parse::<usize>().unwrap_or(0)),
                            _ => (usize::MAX, 0),
                        };
                        let in_range = off.checked_add(len).filter(|&end| end <= buf.len());
                        if let (Some(_), Some(d)) = (in_range, &dev) {
                            d.download(off, &mut buf.as_mut_slice()[off..off + len])?;
                        }
                        let sum = in_range.map(|end| pattern::checksum(&buf.as_slice()[off..end]));
                        sums.push(sum.map_or("bad-range".to_owned(), |s| format!("{s:016x}")));
                    }
                    if let Err(e) =
                        engine.notify(reply, &Notification::new(CONTROL, format!("checksums {}", sums.join(" "))))
                    {
                        eprintln!("pdx-bench target: cannot answer {reply}: {e}");
                    }
                }
                _ => eprintln!("pdx-bench target: ignoring control message {msg:?}"),
            }
        }
        // SAFETY: as above.
        if unsafe { libc::getppid() } != parent {
            return Ok(()); // parent died
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

struct TargetProcess {
    child: std::process::Child,
    session: String,
    /// What pages back its buffer, in words.
    pages: String,
    addr: u64,
    len: usize,
}

/// Start `pdx-bench target` serving `buffer` bytes, with `env` set on top
/// of this process's environment.
fn spawn_target(
    opts: &InitiatorOpts,
    buffer: usize,
    env: &[(&str, &str)],
    args: &[&str],
) -> Result<TargetProcess, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["target", "--host", &opts.host, "--buffer", &buffer.to_string(), "--protocol", &opts.protocol])
        .args(["--location", &opts.remote_location, "--huge", opts.huge.name()])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start the target process: {e}"))?;
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(l) if !l.trim().is_empty() => l,
        _ => {
            let _ = child.kill();
            return Err("the target process did not start".into());
        }
    };
    let v: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| format!("target said {line:?}: {e}"))?;
    Ok(TargetProcess {
        session: v["session"].as_str().unwrap_or_default().to_owned(),
        pages: v["pages"].as_str().unwrap_or("unknown").to_owned(),
        addr: v["addr"].as_u64().unwrap_or(0),
        len: v["len"].as_u64().unwrap_or(0) as usize,
        child,
    })
}

fn loopback(opts: InitiatorOpts) -> Result<(), String> {
    if opts.compare_paths {
        return compare::run(&opts);
    }
    let staged = device::ordinal(&opts.location)?.is_some() || device::ordinal(&opts.remote_location)?.is_some();
    if !(opts.compare_host && staged) {
        return loopback_once(&opts).map(|_| ());
    }
    let host = InitiatorOpts { location: "cpu:0".into(), remote_location: "cpu:0".into(), ..opts.clone() };
    let host_rows = loopback_once(&host)?;
    let staged_rows = loopback_once(&opts)?;
    report::print_comparison(
        &format!("staged ({} -> {}) against host memory", opts.location, opts.remote_location),
        &host_rows,
        &staged_rows,
    );
    Ok(())
}

fn loopback_once(opts: &InitiatorOpts) -> Result<Vec<report::Row>, String> {
    let opts = opts.clone();
    let mut t = spawn_target(&opts, opts.buffer, &[], &[])?;
    if opts.huge != Pages::Normal {
        println!("target buffer: {}", t.pages);
    }
    let result = initiator(&opts, &t.session, t.addr, t.len);
    t.stop();
    result
}

impl TargetProcess {
    /// Closing its stdin tells the target to quit; kill it if it lingers.
    fn stop(&mut self) {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The data path an engine's peer took, from its `peer_info`.
struct PathTaken {
    /// "same-host", "tcp", or "unknown" (the backend keeps no figures per peer).
    taken: String,
    reason: String,
}

/// Which path the data to `session` took and why.
fn peer_path(engine: &dyn TransferBackend, session: &str) -> PathTaken {
    match engine.peer_info(session) {
        Ok(info) => PathTaken {
            taken: info["path"].as_str().unwrap_or("unknown").to_owned(),
            reason: info["reason"].as_str().unwrap_or_default().to_owned(),
        },
        Err(e) => PathTaken { taken: "unknown".into(), reason: e.to_string() },
    }
}

impl PathTaken {
    /// The path for a title: the one taken, or the engine's protocol when
    /// the backend does not say.
    fn title(&self, protocol: &str) -> String {
        match self.taken.as_str() {
            "unknown" => protocol.to_owned(),
            taken => taken.to_owned(),
        }
    }

    /// Print it; a run that asked for `auto` and ended on TCP says so in a
    /// WARNING line.
    fn print(&self, session: &str, requested: &str) {
        println!("data path to {session}: {} (asked for {requested}): {}", self.taken, self.reason);
        if requested == "auto" && self.taken == "tcp" {
            println!("WARNING: --path auto ended on TCP, not the same-host link: {}", self.reason);
        }
    }
}

fn initiator(
    opts: &InitiatorOpts,
    session: &str,
    remote_addr: u64,
    remote_len: usize,
) -> Result<Vec<report::Row>, String> {
    let engine = start_engine(&opts.host, &opts.protocol)?;
    println!("metadata: {} (peers found {})", metadata_mode(engine.as_ref()), found_how(engine.as_ref()));
    let ctx = run::Context { engine: engine.as_ref(), session, remote_addr, remote_len, opts };
    let mut rows = Vec::new();
    if matches!(opts.workload, Workload::Blocks | Workload::All) {
        let (measured, moved) = run::block_sweep(&ctx)?;
        rows.extend(measured);
        report::print_table(
            &format!(
                "pdx {:?} over {} ({} -> {}), local {} remote {}",
                opts.op,
                peer_path(engine.as_ref(), session).title(engine.protocol()),
                engine.session_id(),
                session,
                opts.location,
                opts.remote_location
            ),
            &rows,
        );
        run::verify(&ctx, &moved)?;
    }
    let mut kv_rows = Vec::new();
    if matches!(opts.workload, Workload::Kv | Workload::All) {
        kv_rows = kv::run(&ctx)?;
    }
    let stats = engine.stats();
    report::print_stats(&stats, run::stats_cost());
    let taken = peer_path(engine.as_ref(), session);
    taken.print(session, opts.path.name());
    let json = serde_json::json!({
        "path": taken.taken, "path_requested": opts.path.name(), "path_reason": taken.reason, "pages": opts.huge.name(),
        "op": format!("{:?}", opts.op).to_lowercase(), "protocol": opts.protocol, "threads": opts.threads,
        "blocks": rows.iter().map(report::Row::to_json).collect::<Vec<_>>(),
        "kv": kv_rows,
        "stats": {"tasks_written": stats.tasks_written, "tasks_read": stats.tasks_read,
                  "bytes_written": stats.bytes_written, "bytes_read": stats.bytes_read,
                  "tasks_failed": stats.tasks_failed,
                  "latency_p50_us": stats.latency_p50_us, "latency_p99_us": stats.latency_p99_us},
    });
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&json).unwrap_or_default())
            .map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    if let Some(path) = &opts.plot {
        if !rows.is_empty() {
            let svg = report::svg_plot(
                &format!(
                    "pdx {} throughput over {}",
                    format!("{:?}", opts.op).to_lowercase(),
                    taken.title(engine.protocol())
                ),
                &rows,
            );
            std::fs::write(path, svg).map_err(|e| format!("cannot write {path}: {e}"))?;
            println!("plot written to {path}");
        }
    }
    Ok(rows)
}
