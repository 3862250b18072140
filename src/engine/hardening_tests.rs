//! Tests of the engine's limits, deadlines and budgets under hostile or
//! stalled peers (issue #11). Loopback only; every wait is bounded and the
//! bounds are generous (they check correctness, not speed).

use std::time::{Duration, Instant};

use super::protocol::wire;
use super::*;
use crate::error::ErrorKind;
use crate::transfer::TaskState;

fn settings() -> Settings {
    let mut s = Settings::from_env();
    s.force_v1 = false;
    s
}

fn engine_with(s: Settings) -> Engine {
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

fn addr(v: &[u8]) -> u64 {
    v.as_ptr() as u64
}

fn req(local: &[u8], remote: u64, len: usize) -> Request {
    Request { local: local.as_ptr() as usize, remote, len }
}

#[test]
fn bogus_lengths_and_oversized_batches_are_refused_up_front() {
    let mut s = settings();
    s.max_batch_entries = 1000;
    let (a, b) = (engine_with(s), engine_with(settings()));
    let target = vec![0u8; 4096];
    b.register(addr(&target), 4096).unwrap();
    let src = vec![7u8; 8192];
    let started = Instant::now();
    for dir in [Direction::Write, Direction::Read] {
        // SAFETY: nothing is moved: the request is refused before any I/O.
        let e = unsafe { a.transfer_sync(b.session_id(), dir, vec![req(&src, addr(&target), 1 << 62)]) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // SAFETY: as above.
        let e = unsafe { a.submit(b.session_id(), dir, vec![req(&src, addr(&target), 1 << 62)], None) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    let many = vec![req(&src, addr(&target), 1); 1001];
    // SAFETY: refused before any I/O.
    let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, many) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(started.elapsed() < Duration::from_secs(2), "refusals are immediate");
    // Longer than the largest region the peer advertised: first while the
    // descriptor is not cached yet (the batch fails as invalid), then cached.
    for _ in 0..2 {
        // SAFETY: `src` outlives the call; the request is refused before any byte moves.
        let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, addr(&target), 8192)]) }
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    // A larger region registered later is seen (the descriptor is refreshed).
    let bigger = vec![0u8; 16384];
    b.register(addr(&bigger), bigger.len() as u64).unwrap();
    // SAFETY: `src` and `bigger` outlive the call.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, addr(&bigger), 8192)]) }.unwrap();
    assert!(bigger[..8192].iter().all(|&x| x == 7));
}

// ------------------------------------------------------------ frozen peers

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::protocol::descriptor::{encode_descriptor, AdvertisedBuffer};
use super::protocol::wire::{check_frame_length, encode_frame, split_frame_body, FrameType};

/// A stand-in for a peer that can be frozen as SIGSTOP freezes a process:
/// the kernel still accepts connections and buffers bytes, but nobody
/// reads or answers. Handshakes are answered here (with a descriptor that
/// sends data connections to the proxy); data connections are forwarded to
/// a real engine while not frozen.
pub(super) struct Freezable {
    pub(super) session: String,
    frozen: Arc<AtomicBool>,
    slow: Arc<AtomicBool>,
    _target: Engine,
}

fn forward(mut from: TcpStream, mut to: TcpStream, frozen: Arc<AtomicBool>, slow: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        while frozen.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Slow: 64 KiB every 50 ms (about 1.3 MB/s), progressing all along.
        let chunk = if slow.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(50));
            64 * 1024
        } else {
            buf.len()
        };
        match from.read(&mut buf[..chunk]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn serve_fake_handshakes(rpc: TcpListener, desc: String, frozen: Arc<AtomicBool>) {
    for stream in rpc.incoming() {
        let Ok(mut s) = stream else { return };
        let (desc, frozen) = (desc.clone(), frozen.clone());
        std::thread::spawn(move || {
            while frozen.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut prefix = [0u8; 8];
            if s.read_exact(&mut prefix).is_err() {
                return;
            }
            let Ok(len) = check_frame_length(prefix, 1 << 20) else { return };
            let mut body = vec![0u8; len];
            if s.read_exact(&mut body).is_err() {
                return;
            }
            let (kind, _) = split_frame_body(&body);
            let reply = match kind {
                FrameType::Metadata => desc,
                FrameType::Notify => r#"{"name":"","notify_msg":"success"}"#.to_owned(),
                _ => r#"{"status":"success"}"#.to_owned(),
            };
            let _ = s.write_all(&encode_frame(kind, &reply));
        });
    }
}

impl Freezable {
    /// A peer whose real engine registered `region` (its address range).
    pub(super) fn new(region: &[u8]) -> Freezable {
        let target = engine_with(settings());
        target.register(addr(region), region.len() as u64).unwrap();
        // A small receive buffer (inherited by accepted sockets) keeps what
        // the kernel holds for a slow proxy small, as on a real slow link.
        let data = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        data.set_recv_buffer_size(256 * 1024).unwrap();
        data.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        data.listen(128).unwrap();
        let data: TcpListener = data.into();
        let rpc = TcpListener::bind("127.0.0.1:0").unwrap();
        let session = format!("127.0.0.1:{}", rpc.local_addr().unwrap().port());
        let buffers = [AdvertisedBuffer { addr: addr(region), length: region.len() as u64 }];
        let instance = &target.inner.identity.instance;
        let desc = encode_descriptor(&session, instance, "127.0.0.1", data.local_addr().unwrap().port(), &buffers);
        let frozen = Arc::new(AtomicBool::new(false));
        let f2 = frozen.clone();
        std::thread::spawn(move || serve_fake_handshakes(rpc, desc, f2));
        let slow = Arc::new(AtomicBool::new(false));
        let (f3, s3, real) = (frozen.clone(), slow.clone(), target.data_port());
        std::thread::spawn(move || {
            for stream in data.incoming() {
                let Ok(inbound) = stream else { return };
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", real)) else { continue };
                let (i2, o2) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
                let (fa, fb, sa, sb) = (f3.clone(), f3.clone(), s3.clone(), s3.clone());
                std::thread::spawn(move || forward(inbound, outbound, fa, sa));
                std::thread::spawn(move || forward(o2, i2, fb, sb));
            }
        });
        Freezable { session, frozen, slow, _target: target }
    }

    pub(super) fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    /// Let it run again (what it held is forwarded).
    pub(super) fn thaw(&self) {
        self.frozen.store(false, Ordering::Release);
    }

    /// Forward about 1.3 MB/s (`true`) or at full speed.
    pub(super) fn slow(&self, slow: bool) {
        self.slow.store(slow, Ordering::Release);
    }
}

fn timeouts(secs: u64) -> Settings {
    let mut s = settings();
    let t = Duration::from_secs(secs);
    (s.progress_timeout, s.status_timeout, s.handshake_timeout, s.connect_timeout, s.lane_wait_timeout) =
        (t, t, t, t, t);
    s
}

/// 1.1 x the timeout + 1 s: the bound a task to a frozen peer must fail in.
fn bound(secs: u64) -> Duration {
    Duration::from_secs_f64(1.1 * secs as f64 + 1.0)
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    Read,
    Async,
}

/// `op` against a peer frozen after a warm-up transfer (its descriptor and
/// lanes are cached): the task fails, as a timeout, within the bound.
fn frozen_peer_fails_in_time(op: Op, secs: u64) {
    const LEN: usize = 160 << 20; // 40 pieces, over two lanes
    let region = vec![0u8; LEN];
    let peer = Freezable::new(&region);
    let a = engine_with(timeouts(secs));
    let mut local = vec![0u8; LEN];
    let warm = Request { local: local.as_mut_ptr() as usize, remote: addr(&region), len: 4096 };
    // SAFETY: `local` and `region` outlive every transfer of this test.
    unsafe { a.transfer_sync(&peer.session, Direction::Write, vec![warm]) }.unwrap();
    peer.freeze();
    let whole = Request { local: local.as_mut_ptr() as usize, remote: addr(&region), len: LEN };
    let t0 = Instant::now();
    // SAFETY: as above; every batch is finished before the buffers drop.
    let result = unsafe {
        match op {
            Op::Write => a.transfer_sync(&peer.session, Direction::Write, vec![whole]),
            Op::Read => a.transfer_sync(&peer.session, Direction::Read, vec![whole]),
            Op::Async => {
                let reqs = (0..16)
                    .map(|i| Request {
                        local: local.as_mut_ptr() as usize + i * (LEN / 16),
                        remote: addr(&region) + (i * (LEN / 16)) as u64,
                        len: LEN / 16,
                    })
                    .collect();
                let id = a.submit(&peer.session, Direction::Write, reqs, None).unwrap();
                let s = a.batch_wait(id, Duration::from_secs(120)).unwrap();
                assert_eq!((s.failed, s.total), (16, 16), "every task of the frozen batch fails");
                a.batch_outcome(id)
            }
        }
    };
    let took = t0.elapsed();
    let e = result.unwrap_err();
    println!("{op:?} to a frozen peer with {secs} s timeouts failed after {took:?}: {e}");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(took <= bound(secs), "{op:?} took {took:?}, over {:?}", bound(secs));
    drop(a);
}

#[test]
fn frozen_peer_write_fails_within_the_bound_2s() {
    frozen_peer_fails_in_time(Op::Write, 2);
}

#[test]
fn frozen_peer_read_fails_within_the_bound_2s() {
    frozen_peer_fails_in_time(Op::Read, 2);
}

#[test]
fn frozen_peer_async_batch_fails_within_the_bound_2s() {
    frozen_peer_fails_in_time(Op::Async, 2);
}

#[test]
fn frozen_peer_write_fails_within_the_bound_5s() {
    frozen_peer_fails_in_time(Op::Write, 5);
}

#[test]
fn frozen_peer_read_fails_within_the_bound_5s() {
    frozen_peer_fails_in_time(Op::Read, 5);
}

#[test]
fn frozen_peer_async_batch_fails_within_the_bound_5s() {
    frozen_peer_fails_in_time(Op::Async, 5);
}

#[test]
fn a_slow_transfer_that_keeps_progressing_is_not_killed() {
    const LEN: usize = 8 << 20;
    let region = vec![0u8; LEN];
    let peer = Freezable::new(&region);
    let a = engine_with(timeouts(2));
    let src: Vec<u8> = (0..LEN).map(|i| (i * 31 % 251) as u8).collect();
    let warm = Request { local: src.as_ptr() as usize, remote: addr(&region), len: 4096 };
    // SAFETY: `src` and `region` outlive every transfer of this test.
    unsafe { a.transfer_sync(&peer.session, Direction::Write, vec![warm]) }.unwrap();
    peer.slow.store(true, Ordering::Release);
    let t0 = Instant::now();
    let whole = Request { local: src.as_ptr() as usize, remote: addr(&region), len: LEN };
    // SAFETY: as above.
    unsafe { a.transfer_sync(&peer.session, Direction::Write, vec![whole]) }.unwrap();
    let took = t0.elapsed();
    println!("8 MiB through a 1.3 MB/s link with 2 s timeouts: {took:?}");
    assert!(took > Duration::from_secs(4), "the link was slow ({took:?}): the test means something");
    assert!(region == src);
}

#[test]
fn a_healthy_peer_is_served_while_another_is_frozen() {
    const LEN: usize = 16 << 20;
    let region = vec![0u8; LEN];
    let frozen = Freezable::new(&region);
    let a = engine_with(settings()); // 30 s defaults: the frozen batches stay stuck
    let local = vec![0u8; LEN];
    let warm = Request { local: local.as_ptr() as usize, remote: addr(&region), len: 4096 };
    // SAFETY: `local` and `region` outlive every batch of this test (the
    // engine is dropped, failing what is left, before they are).
    unsafe { a.transfer_sync(&frozen.session, Direction::Write, vec![warm]) }.unwrap();
    frozen.freeze();
    let mut stuck = Vec::new();
    for _ in 0..10 {
        let r = Request { local: local.as_ptr() as usize, remote: addr(&region), len: LEN };
        // SAFETY: as above.
        stuck.push(unsafe { a.submit(&frozen.session, Direction::Write, vec![r], None) }.unwrap());
    }
    std::thread::sleep(Duration::from_millis(200)); // the frozen batches hold their workers
    let healthy = engine_with(settings());
    let target = vec![0u8; 1 << 20];
    healthy.register(addr(&target), target.len() as u64).unwrap();
    let src = vec![9u8; 1 << 20];
    let t0 = Instant::now();
    let r = Request { local: src.as_ptr() as usize, remote: addr(&target), len: src.len() };
    // SAFETY: `src` and `target` outlive the batch.
    let id = unsafe { a.submit(healthy.session_id(), Direction::Write, vec![r], None) }.unwrap();
    let s = a.batch_wait(id, Duration::from_secs(30)).unwrap();
    let took = t0.elapsed();
    println!("1 MiB batch to a healthy peer behind 10 frozen batches: {took:?}");
    assert_eq!(s.state, TaskState::Completed);
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(target == src);
    for id in stuck {
        assert!(!a.batch_summary(id).unwrap().state.is_terminal(), "the frozen peer's batches are still waiting");
    }
    drop(a); // fails the frozen batches at once
}

// ------------------------------------------------------ unregister fence

/// A raw data connection asking `b` for `len` bytes at `remote` (v2), or
/// starting a write of `len` bytes there.
fn raw_request(b: &Engine, direction: Direction, remote: u64, len: u64) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", b.data_port())).unwrap();
    let h = wire::RequestHeader { size: len, addr: remote, direction, acknowledged: true };
    s.write_all(&h.encode()).unwrap();
    s
}

#[test]
fn unregister_then_reuse_leaks_nothing_over_50_runs() {
    const LEN: usize = 8 << 20;
    let b = engine_with(settings());
    let mut region = vec![0u8; LEN];
    let (mut leaked, mut worst) = (0usize, Duration::ZERO);
    for run in 0..50 {
        region.fill(0xAA);
        b.register(addr(&region), LEN as u64).unwrap();
        // An inbound READ whose reader does not read: the target's thread
        // blocks inside a send from the region.
        let mut reader = raw_request(&b, Direction::Read, addr(&region), LEN as u64);
        // An inbound WRITE that stops half way: blocked in a receive into it.
        let mut writer = raw_request(&b, Direction::Write, addr(&region) + (LEN / 2) as u64, (LEN / 2) as u64);
        writer.write_all(&vec![0xAAu8; 64 * 1024]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let t0 = Instant::now();
        b.unregister(addr(&region)).unwrap();
        worst = worst.max(t0.elapsed());
        // The application reuses the buffer at once.
        region.fill(0x55);
        // The writer goes on sending; the reader drains what it gets.
        let _ = writer.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = writer.write_all(&vec![0xCCu8; 1 << 20]);
        reader.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let _ = reader.read_to_end(&mut got);
        let payload = got.get(8..).unwrap_or(&[]); // after the v2 status frame
        let new_bytes = payload.iter().filter(|&&x| x != 0xAA).count();
        let overwritten = region.iter().filter(|&&x| x != 0x55).count();
        if new_bytes + overwritten > 0 {
            println!("run {run}: {new_bytes} new bytes sent, {overwritten} bytes overwritten");
        }
        leaked += new_bytes + overwritten;
        assert!(payload.len() < LEN, "the read was cut short");
    }
    println!("50 unregister-then-reuse runs: {leaked} bytes leaked; slowest unregister {worst:?}");
    assert_eq!(leaked, 0);
    assert!(worst < Duration::from_secs(2), "unregister returns promptly: {worst:?}");
}

// ------------------------------------------------------ slow strangers

#[test]
fn trickling_handshake_connections_do_not_stop_a_new_peer() {
    let victim = engine_with(settings());
    let port = victim.rpc_port();
    let stop = Arc::new(AtomicBool::new(false));
    // Each trickler reports once it has connected and sent its first byte
    // (or given up: the victim may refuse some, as before).
    let (trickling, started) = std::sync::mpsc::channel::<()>();
    let mut tricklers = Vec::new();
    for _ in 0..64 {
        let (stop, trickling) = (stop.clone(), trickling.clone());
        tricklers.push(std::thread::spawn(move || {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                let _ = trickling.send(());
                return;
            };
            // A frame length prefix, then one byte a second.
            for (i, b) in (100u64).to_le_bytes().iter().chain([b'{'; 100].iter()).enumerate() {
                let sent = !stop.load(Ordering::Acquire) && s.write_all(&[*b]).is_ok();
                if i == 0 {
                    let _ = trickling.send(());
                }
                if !sent {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1000));
            }
        }));
    }
    // All 64 are open and trickling: wait for each one's first byte and for
    // the victim to hold them, not for a time.
    for _ in 0..64 {
        started.recv_timeout(Duration::from_secs(20)).expect("every trickler starts");
    }
    let (_, handshakes, _, per_address) = victim.inner.budget.caps();
    let held = 64.min(handshakes).min(per_address) as u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    while victim.stats().gauges.inbound_connections_open < held && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(victim.stats().gauges.inbound_connections_open >= held, "the victim holds the trickling connections");
    let target = vec![0u8; 4096];
    victim.register(addr(&target), 4096).unwrap();
    let newcomer = engine_with(settings());
    let t0 = Instant::now();
    newcomer.probe(victim.session_id()).unwrap();
    let src = vec![3u8; 4096];
    // SAFETY: `src` and `target` outlive the call.
    unsafe { newcomer.transfer_sync(victim.session_id(), Direction::Write, vec![req(&src, addr(&target), 4096)]) }
        .unwrap();
    newcomer.notify(victim.session_id(), &Notification::new("kv", "done")).unwrap();
    let took = t0.elapsed();
    println!("probe, handshake + write, notify past 64 trickling handshake connections: {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(target == src);
    assert_eq!(victim.drain_notifications(), vec![Notification::new("kv", "done")]);
    stop.store(true, Ordering::Release);
    for t in tricklers {
        t.join().unwrap();
    }
}

#[test]
fn handshake_bytes_in_flight_stay_within_the_engine_budget() {
    // The budget is 4 frames of MC_HANDSHAKE_MAX_LENGTH (1 MiB here). Six
    // clients each send all but the last byte of a 1 MiB frame: at most four
    // can hold their frame's bytes, the others are closed before the
    // handshake deadline, and once the holders leave the budget is free.
    let victim = engine_with(settings());
    assert_eq!(victim.inner.settings.handshake_max_len, 1 << 20);
    let port = victim.rpc_port();
    let len = 1usize << 20;
    let mut clients = Vec::new();
    for _ in 0..6 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut frame = (len as u64).to_le_bytes().to_vec();
        frame.resize(8 + len - 1, b' ');
        // A refused client may be closed while it writes: that is the point.
        let _ = s.write_all(&frame);
        clients.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut open = 0;
    for s in &mut clients {
        s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut byte = [0u8; 1];
        match s.read(&mut byte) {
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => open += 1,
            _ => {} // closed (EOF or reset) by the budget
        }
    }
    println!("of 6 clients holding 1 MiB handshake frames, {open} still held their bytes");
    assert!(open <= 4, "{open} clients hold more than the 4 MiB budget");
    assert!(open >= 1, "the budget admits whole frames");
    drop(clients);
    // The holders' bytes are refunded when their connections end.
    let newcomer = engine_with(settings());
    let t0 = Instant::now();
    loop {
        match newcomer.probe(victim.session_id()) {
            Ok(()) => break,
            Err(e) if t0.elapsed() < Duration::from_secs(3) => {
                println!("probe while the budget drains: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the handshake budget was not refunded: {e}"),
        }
    }
    // The server refunds a handshake's bytes just after it replies, so the
    // probe's own few bytes may still be charged for a moment.
    let t0 = Instant::now();
    while victim.inner.budget.handshake_bytes_in_flight() != 0 && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(victim.inner.budget.handshake_bytes_in_flight(), 0);
}

// -------------------------------------- slow strangers announcing big frames

/// Make sure this process may hold `needed` descriptors (raising the soft
/// `RLIMIT_NOFILE` toward the hard one if it is lower).
fn ensure_fds(needed: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into our local.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < needed {
        let want = libc::rlimit { rlim_cur: needed.min(lim.rlim_max), rlim_max: lim.rlim_max };
        // SAFETY: setrlimit reads one rlimit from our local; raising the soft limit up to the hard one is allowed.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) }, 0);
        assert!(
            want.rlim_cur >= needed,
            "RLIMIT_NOFILE hard limit {} is under the {needed} this test needs",
            lim.rlim_max
        );
    }
}

/// Slow handshake connections, opened as the attacker of issue 18 opens
/// them: each announces a frame of `announce` bytes and sends its first
/// byte, then one thread sends every connection still open one more byte a
/// second. Connections the victim closes are dropped, not reopened.
struct Tricklers {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl Tricklers {
    /// Open `count` connections; returns once all were tried, with how many opened.
    fn start(port: u16, count: usize, announce: u64) -> (Tricklers, usize) {
        let stop = Arc::new(AtomicBool::new(false));
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut open = Vec::new();
            for _ in 0..count {
                let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { continue };
                let _ = s.set_nodelay(true);
                let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
                let first = [&announce.to_le_bytes()[..], b"{"].concat();
                if s.write_all(&first).is_ok() {
                    open.push(s);
                }
            }
            let _ = opened_tx.send(open.len());
            while !stop2.load(Ordering::Acquire) {
                let next = Instant::now() + Duration::from_secs(1);
                while Instant::now() < next && !stop2.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                open.retain_mut(|s| s.write_all(b" ").is_ok());
            }
            open.len()
        });
        let opened = opened_rx.recv_timeout(Duration::from_secs(120)).expect("the tricklers connected");
        (Tricklers { stop, thread }, opened)
    }

    /// Stop trickling; how many connections the attacker still had open.
    fn stop(self) -> usize {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap()
    }
}

/// The attack of issue 18 and what must hold through it: a peer that wrote
/// to the victim before it (descriptor cached, lanes open) writes again and
/// its notify is delivered; a newcomer's probe and its first write (its own
/// handshake and new lanes) each finish within 2 s; and the victim has been
/// charged only for the few bytes that arrived, not for what was announced.
fn peers_are_served_past_trickling_connections(count: usize, announce: u64, max_len: usize) {
    ensure_fds(count as u64 + 1024);
    let mut s = settings();
    s.handshake_max_len = max_len;
    let victim = engine_with(s.clone());
    let target = vec![0u8; 3 * 4096];
    victim.register(addr(&target), target.len() as u64).unwrap();
    let known = engine_with(s.clone());
    let (before, fresh, again) = (vec![1u8; 4096], vec![2u8; 4096], vec![3u8; 4096]);
    // SAFETY: the sources and `target` outlive every transfer of this test.
    unsafe { known.transfer_sync(victim.session_id(), Direction::Write, vec![req(&before, addr(&target), 4096)]) }
        .unwrap();
    // The victim's threads, sampled through the attack: assembled on one
    // readiness loop, handshakes take no thread each.
    let (sampling, peak_threads) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicUsize::new(0)));
    let sampler = {
        let (sampling, peak, victim) = (sampling.clone(), peak_threads.clone(), victim.inner.clone());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(victim.registry.live_threads(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let threads_before = victim.inner.registry.live_threads();
    let (attack, opened) = Tricklers::start(victim.rpc_port(), count, announce);
    std::thread::sleep(Duration::from_millis(2500));
    let charged = victim.inner.budget.handshake_bytes_in_flight();
    let threads_held = victim.inner.registry.live_threads().saturating_sub(threads_before);
    let newcomer = engine_with(s);
    let t0 = Instant::now();
    let probe = newcomer.probe(victim.session_id());
    let probe_took = t0.elapsed();
    let t1 = Instant::now();
    let to = addr(&target) + 4096;
    // SAFETY: as above.
    let write = unsafe { newcomer.transfer_sync(victim.session_id(), Direction::Write, vec![req(&fresh, to, 4096)]) };
    let write_took = t1.elapsed();
    let to = addr(&target) + 8192;
    // SAFETY: as above.
    let known_write =
        unsafe { known.transfer_sync(victim.session_id(), Direction::Write, vec![req(&again, to, 4096)]) };
    let known_notify = known.notify(victim.session_id(), &Notification::new("kv", "from a known peer"));
    let still_open = attack.stop();
    sampling.store(false, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak_threads = peak_threads.load(Ordering::Relaxed);
    println!(
        "{count} connections announcing {announce} B frames (MC_HANDSHAKE_MAX_LENGTH {max_len}; {opened} opened, \
         {still_open} still open at the end), victim charged {charged} B, {threads_held} threads held, at most {peak_threads} in \
         all: newcomer probe {probe:?} in \
         {probe_took:?}, write {write:?} in {write_took:?}; known peer write {known_write:?}, notify {known_notify:?}"
    );
    assert_eq!(opened, count, "every attacking connection was opened");
    // At most 2 x cores + 16 threads (the engine's own), however many
    // connections trickle.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let bound = 2 * cores + 16;
    assert!(peak_threads <= bound, "{peak_threads} threads for {count} trickling connections (bound {bound})");
    probe.unwrap();
    assert!(probe_took < Duration::from_secs(2), "probe took {probe_took:?}");
    write.unwrap();
    assert!(write_took < Duration::from_secs(2), "write took {write_took:?}");
    known_write.unwrap();
    known_notify.unwrap();
    assert_eq!(target[..4096], before[..]);
    assert_eq!(target[4096..8192], fresh[..]);
    assert_eq!(target[8192..], again[..]);
    let notes = victim.drain_notifications();
    assert!(notes.contains(&Notification::new("kv", "from a known peer")), "{notes:?}");
    // Charged as bytes arrive: at most the handshake-connection cap's worth
    // of tricklers, each with its first byte and about one a second since.
    let cap = victim.inner.budget.caps().1;
    assert!(charged <= cap * 8, "{charged} B charged for {cap} connections that sent a few bytes each");
}

#[test]
fn sixty_four_connections_announcing_1_mib_frames_do_not_stop_a_new_peer() {
    peers_are_served_past_trickling_connections(64, 1 << 20, 1 << 20);
}

#[test]
fn a_thousand_connections_announcing_1_mib_frames_do_not_stop_a_new_peer() {
    peers_are_served_past_trickling_connections(1024, 1 << 20, 1 << 20);
}

#[test]
fn connections_announcing_frames_of_exactly_the_handshake_limit_do_not_stop_a_new_peer() {
    peers_are_served_past_trickling_connections(64, 2 << 20, 2 << 20);
}

/// Whether `s` is still open: nothing to read within a short wait, not EOF or a reset.
fn still_open(mut s: &TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut byte = [0u8; 1];
    matches!(s.read(&mut byte), Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

#[test]
fn holders_of_the_whole_handshake_budget_give_way_to_a_new_peer() {
    // Clients send all but the last byte of frames of exactly
    // MC_HANDSHAKE_MAX_LENGTH, one after another, and hold them: the last
    // four fill the budget (4 frames) to its bound. A newcomer's handshake
    // takes its bytes from the slowest holders and is served; a known
    // peer's notify is delivered; the charge never passes the bound.
    let victim = engine_with(settings());
    let max_len = victim.inner.settings.handshake_max_len;
    let bound = 4 * max_len;
    let target = vec![0u8; 2 * 4096];
    victim.register(addr(&target), target.len() as u64).unwrap();
    let known = engine_with(settings());
    let (before, fresh) = (vec![1u8; 4096], vec![2u8; 4096]);
    // SAFETY: the sources and `target` outlive every transfer of this test.
    unsafe { known.transfer_sync(victim.session_id(), Direction::Write, vec![req(&before, addr(&target), 4096)]) }
        .unwrap();
    let budget = &victim.inner.budget;
    let peak = std::sync::atomic::AtomicUsize::new(0);
    let sampling = AtomicBool::new(true);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while sampling.load(Ordering::Acquire) {
                peak.fetch_max(budget.handshake_bytes_in_flight(), Ordering::AcqRel);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        let mut holders = Vec::new();
        for k in 1..=8usize {
            let mut s = TcpStream::connect(("127.0.0.1", victim.rpc_port())).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(3))).unwrap();
            let mut frame = (max_len as u64).to_le_bytes().to_vec();
            frame.resize(8 + max_len - 1, b' ');
            let _ = s.write_all(&frame); // a holder that loses its place is closed while it writes
            holders.push(s);
            // Wait (bounded) until the victim has read this frame.
            let t0 = Instant::now();
            while budget.handshake_bytes_in_flight() < k.min(4) * (max_len - 1) && t0.elapsed() < Duration::from_secs(3)
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let full = budget.handshake_bytes_in_flight();
        let holding_before = holders.iter().filter(|s| still_open(s)).count();
        let newcomer = engine_with(settings());
        let t0 = Instant::now();
        let probe = newcomer.probe(victim.session_id());
        let probe_took = t0.elapsed();
        let t1 = Instant::now();
        let to = addr(&target) + 4096;
        // SAFETY: as above.
        let write =
            unsafe { newcomer.transfer_sync(victim.session_id(), Direction::Write, vec![req(&fresh, to, 4096)]) };
        let write_took = t1.elapsed();
        let known_notify = known.notify(victim.session_id(), &Notification::new("kv", "from a known peer"));
        sampling.store(false, Ordering::Release);
        let holding_after = holders.iter().filter(|s| still_open(s)).count();
        let peak = peak.load(Ordering::Acquire);
        println!(
            "8 clients holding frames of exactly {max_len} B: charged {full} B of {bound} B (peak {peak} B), \
             {holding_before} holding; newcomer probe {probe:?} in {probe_took:?}, write {write:?} in \
             {write_took:?}; known peer notify {known_notify:?}; {holding_after} still holding"
        );
        assert_eq!(full, 4 * (max_len - 1), "the last four frames fill the budget to its bound");
        assert_eq!(holding_before, 4);
        assert!(peak <= bound, "{peak} B charged, over the {bound} B budget");
        probe.unwrap();
        assert!(probe_took < Duration::from_secs(2), "probe took {probe_took:?}");
        write.unwrap();
        assert!(write_took < Duration::from_secs(2), "write took {write_took:?}");
        known_notify.unwrap();
        assert!(holding_after < 4, "the newcomer took its bytes from a holder");
    });
    assert_eq!(target[..4096], before[..]);
    assert_eq!(target[4096..], fresh[..]);
    let notes = victim.drain_notifications();
    assert!(notes.contains(&Notification::new("kv", "from a known peer")), "{notes:?}");
}

/// CPU seconds used so far by this process's threads whose name starts
/// with `prefix` (from /proc/self/task/*/stat).
fn thread_cpu(prefix: &str) -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // utime and stime are fields 14 and 15 (11 and 12 after the name).
        total += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    }
    total as f64 / ticks
}

#[test]
fn trickled_one_byte_segments_cost_the_victim_at_most_three_times_the_attacker() {
    let mut s = settings();
    s.spin = Duration::from_micros(50); // the default, explicitly
    let victim = engine_with(s);
    let region = vec![0u8; 1 << 20];
    victim.register(addr(&region), region.len() as u64).unwrap();
    let (port, remote) = (victim.data_port(), addr(&region));
    let victim0 = thread_cpu("pdx-data");
    let run_for = Duration::from_secs(2);
    let tricklers: Vec<_> = (0..32)
        .map(|_| {
            std::thread::Builder::new()
                .name("trickle".into())
                .spawn(move || {
                    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    s.set_nodelay(true).unwrap();
                    let h = wire::RequestHeader {
                        size: 64 << 10,
                        addr: remote,
                        direction: Direction::Write,
                        acknowledged: true,
                    };
                    s.write_all(&h.encode()).unwrap();
                    let t0 = Instant::now();
                    let mut sent = 0usize;
                    while t0.elapsed() < run_for && s.write_all(&[0x42]).is_ok() {
                        sent += 1;
                        std::thread::sleep(Duration::from_micros(500));
                    }
                    sent
                })
                .unwrap()
        })
        .collect();
    // The attacker's CPU is measured from inside its threads' lifetimes.
    std::thread::sleep(run_for - Duration::from_millis(100));
    let attacker = thread_cpu("trickle");
    let victim_cpu = thread_cpu("pdx-data") - victim0;
    let segments: usize = tricklers.into_iter().map(|t| t.join().unwrap()).sum();
    println!("{segments} one-byte segments on 32 connections: victim {victim_cpu:.3} s CPU, attacker {attacker:.3} s");
    // `region` drops before `victim`: withdraw it first, so that no data
    // thread still receiving a trickled payload writes into freed memory.
    victim.unregister(addr(&region)).unwrap();
    assert!(segments > 1000, "the attacker really trickled: {segments}");
    assert!(victim_cpu <= 3.0 * attacker.max(0.05), "victim {victim_cpu:.3} s vs attacker {attacker:.3} s");
}
