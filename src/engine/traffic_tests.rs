//! Traffic as it comes in production (issue 22): idle gaps that the
//! target closes connections in, a target closing a lane just as a request
//! goes out on it, peers advertising a data address nobody answers at, and
//! bursts larger than the lanes can carry at once.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::lifecycle_tests::{fake_mooncake_session, mooncake_descriptor};
use super::protocol::descriptor::{encode_descriptor, AdvertisedBuffer};
use super::protocol::wire::{self, RequestHeader, HEADER_LEN};
use super::*;

fn settings() -> Settings {
    let mut s = Settings::from_env();
    s.force_v1 = false;
    s
}

fn start(s: Settings) -> Engine {
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

fn write(from: &Engine, session: &str, src: &[u8], remote: u64) -> Result<()> {
    let r = Request { local: src.as_ptr() as usize, remote, len: src.len() };
    // SAFETY: the test's buffers outlive the call.
    unsafe { from.transfer_sync(session, Direction::Write, vec![r]) }
}

/// Inbound data connections `e` holds once they are at most `n`, or what
/// they are at `deadline`.
fn open_reaching(e: &Engine, n: u64, deadline: Instant) -> u64 {
    loop {
        let open = e.stats().gauges.inbound_connections_open;
        if open <= n || Instant::now() >= deadline {
            return open;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn idle_inbound_connections_are_closed_and_the_initiator_reconnects_unseen() {
    let mut s = settings();
    s.idle_timeout = Duration::from_millis(500);
    let target = start(s);
    let initiator = start(settings());
    let buf = vec![0u8; 1 << 20];
    target.register(buf.as_ptr() as u64, buf.len() as u64).unwrap();
    let session = target.session_id().to_owned();
    let src = vec![7u8; 64 << 10];
    for round in 0..3 {
        // Four threads at once: several lanes open and are pooled.
        std::thread::scope(|sc| {
            for t in 0..4u64 {
                let (initiator, session, src) = (&initiator, &session, &src);
                let remote = buf.as_ptr() as u64 + t * (64 << 10);
                sc.spawn(move || {
                    for _ in 0..20 {
                        write(initiator, session, src, remote).unwrap();
                    }
                });
            }
        });
        let last = Instant::now();
        assert!(target.stats().gauges.inbound_connections_open >= 1, "round {round}: lanes are open");
        // 500 ms idle: closed 2 s after the last transfer, whatever the poll.
        let open = open_reaching(&target, 0, last + Duration::from_secs(2));
        assert_eq!(open, 0, "round {round}: idle connections left open 2 s after the last transfer");
    }
    let st = initiator.stats();
    assert_eq!(st.tasks_failed, 0, "no transfer failed after its pooled lanes were closed: {st:?}");
    assert_eq!(st.tasks_written, 3 * 4 * 20);
    // Without the option, the default (minutes) keeps them.
    let keeping = start(settings());
    keeping.register(buf.as_ptr() as u64, buf.len() as u64).unwrap();
    write(&initiator, keeping.session_id(), &src, buf.as_ptr() as u64).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(keeping.stats().gauges.inbound_connections_open, 1, "the default idle timeout is minutes");
}

/// A Mooncake-like data port (no hello) serving protocol-v2 writes: the
/// first connection acknowledges its first write, then closes on reading the
/// second header without answering (the target's idle close racing the
/// initiator's send); later connections serve every write. Counts
/// connections and writes served.
fn closing_data_port(conns: Arc<AtomicUsize>, served: Arc<AtomicUsize>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(mut s) = stream else { return };
            let nth = conns.fetch_add(1, Ordering::SeqCst);
            let served = served.clone();
            std::thread::spawn(move || {
                let mut k = 0;
                loop {
                    let mut h = [0u8; HEADER_LEN];
                    if s.read_exact(&mut h).is_err() {
                        return;
                    }
                    if nth == 0 && k == 1 {
                        return; // closed with the request unread
                    }
                    let header = RequestHeader::decode(&h);
                    let mut payload = vec![0u8; header.size as usize];
                    if s.read_exact(&mut payload).is_err() {
                        return;
                    }
                    served.fetch_add(1, Ordering::SeqCst);
                    if s.write_all(&wire::encode_status(wire::STATUS_OK)).is_err() {
                        return;
                    }
                    k += 1;
                }
            });
        }
    });
    port
}

#[test]
fn a_lane_the_target_closes_as_a_request_goes_out_is_replaced_unseen() {
    let buf = vec![0u8; 4096];
    let (conns, served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let data_port = closing_data_port(conns.clone(), served.clone());
    let (desc, fetches) = (Arc::new(Mutex::new(String::new())), Arc::new(AtomicUsize::new(0)));
    let session = fake_mooncake_session(desc.clone(), fetches);
    *desc.lock() = mooncake_descriptor(&session, data_port, &buf);
    let initiator = start(settings());
    for i in 0..4u8 {
        write(&initiator, &session, &[i; 64], buf.as_ptr() as u64).unwrap();
    }
    assert_eq!(served.load(Ordering::SeqCst), 4, "every write served once");
    assert_eq!(conns.load(Ordering::SeqCst), 2, "one new connection replaced the closed one");
    assert_eq!(initiator.stats().tasks_failed, 0);
}

/// A listener whose accept queue is full (backlog 0, one connection never
/// accepted): further SYNs are dropped, so a connect to it gets no answer,
/// like an address nobody owns. Keep the pair alive while it is used.
fn blackhole() -> (socket2::Socket, TcpStream, SocketAddr) {
    use socket2::{Domain, Socket, Type};
    let l = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
    l.listen(0).unwrap();
    let at = l.local_addr().unwrap().as_socket().unwrap();
    let filler = TcpStream::connect(at).unwrap();
    // The queue is full once a second connect gets no answer.
    let probe = TcpStream::connect_timeout(&at, Duration::from_millis(300));
    assert!(probe.is_err(), "the accept queue did not fill: {probe:?}");
    (l, filler, at)
}

#[test]
fn a_peer_advertising_an_unreachable_data_address_fails_each_attempt_within_the_connect_bound() {
    let (_listener, _filler, dead) = blackhole();
    let buf = vec![0u8; 4 << 20];
    let mut s = settings();
    s.connect_timeout = Duration::from_millis(1000);
    let initiator = start(s);
    let bound = Duration::from_millis(1000 + 1500);
    let named = dead.to_string();
    for pdx_like in [false, true] {
        let desc = Arc::new(Mutex::new(String::new()));
        let session = fake_mooncake_session(desc.clone(), Arc::new(AtomicUsize::new(0)));
        *desc.lock() = if pdx_like {
            let b = AdvertisedBuffer { addr: buf.as_ptr() as u64, length: buf.len() as u64 };
            encode_descriptor(&session, "0123abcd", "127.0.0.1", dead.port(), &[b])
        } else {
            mooncake_descriptor(&session, dead.port(), &buf)
        };
        for attempt in 0..3 {
            let t0 = Instant::now();
            let e = write(&initiator, &session, &[1u8; 64], buf.as_ptr() as u64).unwrap_err();
            let took = t0.elapsed();
            assert_eq!(e.kind(), ErrorKind::PeerUnreachable, "{e}");
            assert!(e.message().contains(&named) && e.message().contains(&session), "{e}");
            assert!(took < bound, "attempt {attempt} (pdx-like {pdx_like}) took {took:?}: {e}");
        }
        // A batch spread over every lane and retried piece by piece still
        // fails once, within the bound: 64 entries of 4 MiB (256 MiB, four
        // lanes), submitted asynchronously.
        let reqs: Vec<Request> = (0..64)
            .map(|_| Request { local: buf.as_ptr() as usize, remote: buf.as_ptr() as u64, len: buf.len() })
            .collect();
        let t0 = Instant::now();
        // SAFETY: nothing is read from the local buffer once the peer is unreachable, and it outlives the batch.
        let id = unsafe { initiator.submit(&session, Direction::Write, reqs, None) }.unwrap();
        let summary = initiator.batch_wait(id, Duration::from_secs(30)).unwrap();
        let took = t0.elapsed();
        assert_eq!(summary.failed, 64, "{summary:?}");
        assert!(took < bound, "the batch (pdx-like {pdx_like}) took {took:?}");
        let e = initiator.batch_outcome(id).unwrap_err();
        assert!(e.message().contains(&named), "{e}");
        initiator.batch_free(id).unwrap();
    }
}

const PEERS: usize = 256;
const PER_PEER: usize = 64;
const BLOCK: usize = 16 << 10;

/// Peer `p`'s byte: never 0 (the region's initial value).
fn fill(p: usize) -> u8 {
    (p % 255) as u8 + 1
}

/// 256 peers talk to one target whose idle timeout (500 ms) has closed all
/// their lanes, then each submits 64 transfers at once (far more than its
/// four lanes carry): every one is queued and completes, none is refused.
/// Prints the burst's p99 task latency (`--nocapture`).
#[test]
fn a_burst_after_an_idle_gap_is_queued_and_served_without_a_failure() {
    let mut s = settings();
    s.idle_timeout = Duration::from_millis(500);
    s.max_connections_per_address = 4096;
    s.max_data_connections = 4096;
    let target = start(s);
    let region = vec![0u8; PEERS * BLOCK];
    target.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    let session = target.session_id().to_owned();
    let initiators: Vec<Engine> = (0..PEERS)
        .map(|_| {
            let mut s = settings();
            s.workers = 2;
            start(s)
        })
        .collect();
    let srcs: Vec<Vec<u8>> = (0..PEERS).map(|p| vec![fill(p); BLOCK]).collect();
    // The target's threads, sampled throughout: handshakes on one loop,
    // data connections on the bounded pool, every one counted. The pool
    // grows past its cap (twice the cores, 8 to 32) only for work that
    // cannot be parked (hellos, same-host and device requests) held 200 ms;
    // a request whose peer stalls (a lane of a loaded machine) is parked,
    // not held.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let pool_cap = (2 * cores).clamp(8, 32);
    let sampling = AtomicBool::new(true);
    let (peak_threads, peak_pool) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let peak_open = AtomicUsize::new(0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while sampling.load(Ordering::Relaxed) {
                let registry = &target.inner.registry;
                peak_threads.fetch_max(registry.live_threads(), Ordering::Relaxed);
                peak_pool.fetch_max(registry.live_threads_named("pdx-data"), Ordering::Relaxed);
                peak_open.fetch_max(target.stats().gauges.inbound_connections_open as usize, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        // Every peer's first write at once: its handshake and first lane.
        std::thread::scope(|first| {
            for (p, e) in initiators.iter().enumerate() {
                let (session, src) = (&session, &srcs[p]);
                let to = region.as_ptr() as u64 + (p * BLOCK) as u64;
                first.spawn(move || write(e, session, src, to).unwrap());
            }
        });
        burst(&target, &session, &region, &initiators, &srcs);
        sampling.store(false, Ordering::Relaxed);
    });
    let (peak, pool) = (peak_threads.load(Ordering::Relaxed), peak_pool.load(Ordering::Relaxed));
    let open = peak_open.load(Ordering::Relaxed);
    eprintln!(
        "the target's threads peaked at {peak} with up to {open} data connections open ({PEERS} peers x 4 lanes; \
         bound 2 x {cores} cores + 16), {pool} of them in the data pool (cap {pool_cap})"
    );
    // The burst opened more than one lane per peer: the bound held under
    // many lanes, not one each.
    assert!(open > PEERS, "{open} data connections at most");
    assert!(pool <= pool_cap, "the data pool grew to {pool} threads past its cap {pool_cap}");
    assert!(peak <= 2 * cores + 16, "the target peaked at {peak} threads");
}

/// The burst of [`a_burst_after_an_idle_gap_is_queued_and_served_without_a_failure`]
/// after its idle gap.
fn burst(target: &Engine, session: &str, region: &[u8], initiators: &[Engine], srcs: &[Vec<u8>]) {
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(open_reaching(target, 0, Instant::now() + Duration::from_secs(3)), 0, "the gap closed every lane");
    let t0 = Instant::now();
    let session = session.to_owned();
    let ids: Vec<Vec<u64>> = initiators
        .iter()
        .enumerate()
        .map(|(p, e)| {
            let remote = region.as_ptr() as u64 + (p * BLOCK) as u64;
            (0..PER_PEER)
                .map(|_| {
                    let r = Request { local: srcs[p].as_ptr() as usize, remote, len: BLOCK };
                    // SAFETY: the sources and the region outlive every batch (waited below).
                    unsafe { e.submit(&session, Direction::Write, vec![r], None) }.expect("submitted, never refused")
                })
                .collect()
        })
        .collect();
    for (e, ids) in initiators.iter().zip(&ids) {
        for &id in ids {
            let summary = e.batch_wait(id, Duration::from_secs(60)).unwrap();
            assert_eq!(summary.completed, 1, "{:?}", e.batch_outcome(id));
            e.batch_free(id).unwrap();
        }
    }
    let wall = t0.elapsed();
    let mut p99: Vec<u64> = initiators.iter().map(|e| e.stats().latency_p99_us).collect();
    p99.sort_unstable();
    let failed: u64 = initiators.iter().map(|e| e.stats().tasks_failed).sum();
    assert_eq!(failed, 0);
    for (p, chunk) in region.chunks(BLOCK).enumerate() {
        assert!(chunk.iter().all(|&b| b == fill(p)), "peer {p}'s block");
    }
    eprintln!(
        "burst after a 2 s idle gap: {PEERS} peers x {PER_PEER} transfers of {BLOCK} bytes in {wall:?}, 0 failed; \
         per-peer p99 task latency: median {} us, max {} us",
        p99[PEERS / 2],
        p99[PEERS - 1]
    );
}
