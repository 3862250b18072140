//! Engine-to-engine tests over loopback, plus hostile peers on both
//! listeners. Each test starts its own engines, so tests run in parallel.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use super::initiator::plan;
use super::protocol::wire;
use super::*;
use crate::transfer::TaskState;

/// TCP between the engines (the same-host link has its own tests).
fn settings() -> Settings {
    let mut s = Settings::from_env();
    s.force_v1 = false;
    s.same_host = false;
    s
}

fn engine_with(s: Settings) -> Engine {
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

fn engine() -> Engine {
    engine_with(settings())
}

/// Deterministic pseudo-random bytes.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn addr(v: &[u8]) -> u64 {
    v.as_ptr() as u64
}

fn req(local: &[u8], offset: usize, remote: u64, len: usize) -> Request {
    Request { local: local.as_ptr() as usize + offset, remote, len }
}

#[test]
fn write_and_read_back_one_request() {
    let (a, b) = (engine(), engine());
    let target = vec![0u8; 1 << 20];
    b.register(addr(&target), target.len() as u64).unwrap();
    let src = pattern(target.len(), 1);
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, 0, addr(&target), src.len())]) }.unwrap();
    assert!(target == src);
    let mut back = vec![0u8; src.len()];
    let r = Request { local: back.as_mut_ptr() as usize, remote: addr(&target), len: back.len() };
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, vec![r]) }.unwrap();
    assert!(back == src);
}

fn scattered_batch_round_trip(force_v1: bool) {
    let mut s = settings();
    s.force_v1 = force_v1;
    let (a, b) = (engine_with(s), engine());
    const N: usize = 1500;
    const BLOCK: usize = 777;
    let target = vec![0u8; N * 1024];
    b.register(addr(&target), target.len() as u64).unwrap();
    let src = pattern(N * BLOCK, 2);
    // Scatter: entry i goes to remote slot (i * 7) % N.
    let reqs: Vec<Request> =
        (0..N).map(|i| req(&src, i * BLOCK, addr(&target) + ((i * 7) % N * 1024) as u64, BLOCK)).collect();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, reqs) }.unwrap();
    for i in 0..N {
        let slot = (i * 7) % N * 1024;
        assert_eq!(&target[slot..slot + BLOCK], &src[i * BLOCK..(i + 1) * BLOCK], "entry {i}");
    }
    let back = vec![0u8; N * BLOCK];
    let reqs: Vec<Request> =
        (0..N).map(|i| req(&back, i * BLOCK, addr(&target) + ((i * 7) % N * 1024) as u64, BLOCK)).collect();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, reqs) }.unwrap();
    assert!(back == src);
}

#[test]
fn scattered_batch_v2() {
    scattered_batch_round_trip(false);
}

#[test]
fn scattered_batch_v1_with_fence() {
    scattered_batch_round_trip(true);
}

fn out_of_range_is_refused(force_v1: bool) {
    let mut s = settings();
    s.force_v1 = force_v1;
    let (a, b) = (engine_with(s), engine());
    let target = vec![0u8; 4096];
    b.register(addr(&target), 4096).unwrap();
    let src = pattern(4096, 3);
    let bad = addr(&target) + 4000; // runs past the region
    for dir in [Direction::Write, Direction::Read] {
        // SAFETY: the test's buffers outlive the call (and every batch it starts).
        let e = unsafe { a.transfer_sync(b.session_id(), dir, vec![req(&src, 0, bad, 200)]) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::RemoteRejected, "{dir:?}: {e}");
    }
    // In a batch, only the bad entry fails; its neighbours land.
    let reqs =
        vec![req(&src, 0, addr(&target), 100), req(&src, 100, bad, 200), req(&src, 300, addr(&target) + 300, 100)];
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, reqs.clone()) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RemoteRejected, "{e}");
    assert!(e.message().starts_with("1 of 3 requests failed"), "{e}");
    assert_eq!(&target[..100], &src[..100]);
    assert_eq!(&target[300..400], &src[300..400]);
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let id = unsafe { a.submit(b.session_id(), Direction::Write, reqs, None) }.unwrap();
    let s = a.batch_wait(id, Duration::from_secs(30)).unwrap();
    assert_eq!((s.state, s.completed, s.failed, s.bytes), (TaskState::Failed, 2, 1, 200));
    assert_eq!(a.task_summary(id, 1).unwrap().error.unwrap().kind(), ErrorKind::RemoteRejected);
    assert_eq!(a.task_summary(id, 2).unwrap().state, TaskState::Completed);
    a.batch_free(id).unwrap();
    // The engine still works afterwards.
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, 0, addr(&target), 4096)]) }.unwrap();
    assert!(target == src);
}

#[test]
fn out_of_range_is_refused_v2() {
    out_of_range_is_refused(false);
}

#[test]
fn out_of_range_is_refused_v1() {
    out_of_range_is_refused(true);
}

#[test]
fn zero_length_and_empty_batches_complete_locally() {
    let a = engine();
    // No peer exists at this name; nothing must cross the wire.
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync("127.0.0.1:1", Direction::Write, vec![]) }.unwrap();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync("127.0.0.1:1", Direction::Write, vec![Request { local: 0, remote: 0, len: 0 }]) }.unwrap();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let id = unsafe { a.submit("127.0.0.1:1", Direction::Read, vec![], None) }.unwrap();
    assert_eq!(a.batch_wait(id, Duration::ZERO).unwrap().state, TaskState::Completed);
    a.batch_free(id).unwrap();
}

#[test]
fn async_batches_and_ids() {
    let (a, b) = (engine(), engine());
    let target = vec![0u8; 1 << 16];
    b.register(addr(&target), target.len() as u64).unwrap();
    let src = pattern(1 << 16, 4);
    let reqs: Vec<Request> = (0..16).map(|i| req(&src, i * 4096, addr(&target) + (i * 4096) as u64, 4096)).collect();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let id = unsafe { a.submit(b.session_id(), Direction::Write, reqs, Some(Notification::new("n", "m"))) }.unwrap();
    assert_ne!(id, 0);
    let s = a.batch_wait(id, Duration::from_secs(30)).unwrap();
    assert_eq!((s.state, s.total, s.completed, s.bytes), (TaskState::Completed, 16, 16, 1 << 16));
    assert!(target == src);
    assert_eq!(a.task_summary(id, 15).unwrap().state, TaskState::Completed);
    assert_eq!(a.task_summary(id, 16).unwrap_err().kind(), ErrorKind::IndexOutOfRange);
    assert_eq!(b.drain_notifications(), vec![Notification::new("n", "m")]);
    a.batch_free(id).unwrap();
    for stale in [id, 0, 1, u64::MAX, id ^ (1 << 40)] {
        assert_eq!(a.batch_summary(stale).unwrap_err().kind(), ErrorKind::InvalidHandle, "{stale:#x}");
        assert_eq!(a.batch_free(stale).unwrap_err().kind(), ErrorKind::InvalidHandle);
    }
    // A reused slot gets a new generation: the old id stays dead.
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let id2 = unsafe { a.submit(b.session_id(), Direction::Write, vec![], None) }.unwrap();
    assert_ne!(id2, id);
    assert_eq!(a.batch_summary(id).unwrap_err().kind(), ErrorKind::InvalidHandle);
}

#[test]
fn probe_and_notify_both_ways() {
    let (a, b) = (engine(), engine());
    a.probe(b.session_id()).unwrap();
    b.probe(a.session_id()).unwrap();
    a.notify(b.session_id(), &Notification::new("req-1", "kv ready")).unwrap();
    b.notify(a.session_id(), &Notification::new("req-2", "ack")).unwrap();
    assert_eq!(b.drain_notifications(), vec![Notification::new("req-1", "kv ready")]);
    assert_eq!(a.drain_notifications(), vec![Notification::new("req-2", "ack")]);
    let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    assert_eq!(a.probe(&format!("127.0.0.1:{free}")).unwrap_err().kind(), ErrorKind::PeerUnreachable);
}

/// Notifications are bytes: every byte value, NUL included, arrives intact
/// between pdx engines, alone and riding on a batch. One whose frame is
/// over the handshake frame limit is refused before anything is sent,
/// saying so, and the batch it would ride on never starts; one exactly at
/// the limit goes.
#[test]
fn notifications_are_bytes_and_bounded_by_the_frame_limit() {
    let (a, b) = (engine(), engine());
    let every: Vec<u8> = (0..=255u8).rev().collect();
    let push = b"PUSH_REG:\x82\xa4name\xa1A\x00\x8b\xff".to_vec();
    a.notify(b.session_id(), &Notification::new(every.clone(), push.clone())).unwrap();
    let target = vec![0u8; 8192];
    b.register(addr(&target), target.len() as u64).unwrap();
    let src = pattern(4096, 9);
    let note = Notification::new(b"\x00".to_vec(), every.clone());
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let id = unsafe { a.submit(b.session_id(), Direction::Write, vec![req(&src, 0, addr(&target), 4096)], Some(note)) }
        .unwrap();
    assert_eq!(a.batch_wait(id, Duration::from_secs(30)).unwrap().state, TaskState::Completed);
    a.batch_free(id).unwrap();
    let got = b.drain_notifications();
    assert_eq!(got, vec![Notification::new(every.clone(), push), Notification::new(b"\x00".to_vec(), every)]);

    let limit = a.inner.settings.handshake_max_len;
    let big = Notification::new("kv", vec![0x8bu8; 8 << 20]);
    let e = a.notify(b.session_id(), &big).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains(&format!("handshake frame limit of {limit} bytes")), "{e}");
    assert!(e.message().contains("MC_HANDSHAKE_MAX_LENGTH"), "{e}");
    let tail = req(&src, 0, addr(&target) + 4096, 4096);
    // SAFETY: as above.
    let e = unsafe { a.submit(b.session_id(), Direction::Write, vec![tail], Some(big)) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(target[4096..].iter().all(|&x| x == 0), "the batch never started");
    let empty = Notification::new("n", "");
    let fits = Notification::new("n", vec![b'x'; limit - protocol::notify::frame_len(&empty)]);
    a.notify(b.session_id(), &fits).unwrap();
    assert_eq!(b.drain_notifications(), vec![fits]);
}

#[test]
fn many_threads_submit_at_once() {
    let (a, b) = (engine(), engine());
    const THREADS: usize = 8;
    const PER: usize = 40;
    const BLOCK: usize = 3000;
    let target = vec![0u8; THREADS * PER * BLOCK];
    b.register(addr(&target), target.len() as u64).unwrap();
    let src = pattern(target.len(), 5);
    let base = addr(&target);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (a, b, src) = (&a, &b, &src);
            s.spawn(move || {
                for k in 0..PER {
                    let off = (t * PER + k) * BLOCK;
                    let r = req(src, off, base + off as u64, BLOCK);
                    if k % 2 == 0 {
                        // SAFETY: the test's buffers outlive the call (and every batch it starts).
                        unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![r]) }.unwrap();
                    } else {
                        // SAFETY: the test's buffers outlive the call (and every batch it starts).
                        let id = unsafe { a.submit(b.session_id(), Direction::Write, vec![r], None) }.unwrap();
                        assert_eq!(a.batch_wait(id, Duration::from_secs(30)).unwrap().state, TaskState::Completed);
                        a.batch_free(id).unwrap();
                    }
                }
            });
        }
    });
    assert!(target == src);
}

#[test]
fn peer_stopped_mid_transfer_fails_fast() {
    // The target stops as soon as it has served its first request, so the
    // stop lands while the other 255 are in flight, unless this thread is
    // descheduled for the whole rest of the transfer. An attempt where that
    // happened is recognized (every request served, the call succeeded) and
    // run again: each attempt asserts what it saw, and the test needs one
    // stop that landed mid-transfer.
    const REQUESTS: usize = 256;
    for attempt in 1..=5 {
        let (a, b) = (engine(), engine());
        let target = vec![0u8; REQUESTS << 20];
        b.register(addr(&target), target.len() as u64).unwrap();
        let src = vec![7u8; target.len()];
        let session = b.session_id().to_owned();
        let started = Instant::now();
        let result = std::thread::scope(|s| {
            // SAFETY: the test's buffers outlive the call (and every batch it starts).
            let writer = s.spawn(|| unsafe {
                let reqs =
                    (0..REQUESTS).map(|i| req(&src, i << 20, addr(&target) + (i << 20) as u64, 1 << 20)).collect();
                a.transfer_sync(&session, Direction::Write, reqs)
            });
            let deadline = Instant::now() + Duration::from_secs(20);
            while b.stats().served_writes == 0 && !writer.is_finished() && Instant::now() < deadline {
                std::thread::yield_now();
            }
            b.stop();
            writer.join().unwrap()
        });
        // Never a hang: every wait is bounded.
        assert!(started.elapsed() < Duration::from_secs(20), "attempt {attempt}");
        let served = b.stats().served_writes;
        match result {
            Ok(()) => assert_eq!(served, REQUESTS as u64, "attempt {attempt}: a success was served whole"),
            Err(e) => {
                assert!(
                    matches!(e.kind(), ErrorKind::ConnectionLost | ErrorKind::PeerUnreachable | ErrorKind::Timeout),
                    "attempt {attempt}: {e}"
                );
                // The stopped peer stays unreachable.
                // SAFETY: the test's buffers outlive the call (and every batch it starts).
                let e = unsafe { a.transfer_sync(&session, Direction::Write, vec![req(&src, 0, addr(&target), 10)]) }
                    .unwrap_err();
                assert!(matches!(e.kind(), ErrorKind::PeerUnreachable | ErrorKind::ConnectionLost), "{e}");
                return;
            }
        }
    }
    panic!("in 5 attempts the stop never landed before the transfer finished");
}

#[test]
fn silent_peer_times_out() {
    // A handshake port that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut s = settings();
    s.handshake_timeout = Duration::from_millis(300);
    let a = engine_with(s);
    let src = [1u8; 8];
    let started = Instant::now();
    // SAFETY: the test's own buffers and strings outlive the call.
    let e = unsafe {
        a.transfer_sync(&silent.local_addr().unwrap().to_string(), Direction::Write, vec![req(&src, 0, 4096, 8)])
    }
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn stalled_data_peer_hits_the_progress_deadline() {
    // A fake peer: answers the handshake with a descriptor whose data port
    // accepts connections but never reads or answers.
    let rpc = TcpListener::bind("127.0.0.1:0").unwrap();
    let session = rpc.local_addr().unwrap().to_string();
    let data = TcpListener::bind("127.0.0.1:0").unwrap();
    let data_port = data.local_addr().unwrap().port();
    // The fake holds the data connection until the test is done with it.
    let (done, held_until) = std::sync::mpsc::channel::<()>();
    let fake = std::thread::spawn(move || {
        let (mut c, _) = rpc.accept().unwrap();
        let mut prefix = [0u8; 8];
        c.read_exact(&mut prefix).unwrap();
        let mut body = vec![0u8; u64::from_le_bytes(prefix) as usize];
        c.read_exact(&mut body).unwrap();
        let desc = format!(r#"{{"protocol":"tcp","tcp_data_port":{data_port},"tcp_proto_version":2}}"#);
        c.write_all(&wire::encode_frame(FrameType::Metadata, &desc)).unwrap();
        let held = data.accept().unwrap();
        let _ = held_until.recv_timeout(Duration::from_secs(30));
        drop(held);
    });
    let mut s = settings();
    s.progress_timeout = Duration::from_millis(300);
    s.status_timeout = Duration::from_millis(300);
    let a = engine_with(s);
    let src = vec![0u8; 64 << 20]; // more than the socket buffers hold
    let started = Instant::now();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let e = unsafe { a.transfer_sync(&session, Direction::Write, vec![req(&src, 0, 4096, src.len())]) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(started.elapsed() < Duration::from_secs(3), "took {:?}", started.elapsed());
    done.send(()).unwrap();
    fake.join().unwrap();
}

/// The next connection `listener` gets, waiting at most `limit`.
fn accept_within(listener: &TcpListener, limit: Duration) -> TcpStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                listener.set_nonblocking(false).unwrap();
                stream.set_nonblocking(false).unwrap();
                return stream;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("no connection within {limit:?}: {e}"),
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn peer_restarted_under_the_same_name() {
    let rpc_port = free_port();
    let with_ports = |data: u16| {
        let mut s = settings();
        (s.min_port, s.max_port, s.min_data_port, s.max_data_port) = (rpc_port, rpc_port, data, data);
        s
    };
    let a = engine();
    let target = vec![0u8; 4096];
    let src = pattern(4096, 6);
    let b = engine_with(with_ports(free_port()));
    let session = b.session_id().to_owned();
    b.register(addr(&target), 4096).unwrap();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(&session, Direction::Write, vec![req(&src, 0, addr(&target), 1000)]) }.unwrap();
    drop(b);
    // Same name, new data port, new memory.
    let target2 = vec![0u8; 4096];
    let b2 = engine_with(with_ports(free_port()));
    assert_eq!(b2.session_id(), session);
    b2.register(addr(&target2), 4096).unwrap();
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(&session, Direction::Write, vec![req(&src, 0, addr(&target2), 4096)]) }.unwrap();
    assert!(target2 == src);
}

fn send_raw(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = c.write_all(bytes);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    out
}

#[test]
fn garbage_on_both_listeners_leaves_the_engine_serving() {
    let (a, b) = (engine(), engine());
    let target = vec![0u8; 4096];
    b.register(addr(&target), 4096).unwrap();
    let rpc = b.rpc_port();
    // Handshake port: empty, oversized, truncated, non-JSON frames get no reply.
    for junk in [
        &0u64.to_le_bytes()[..],
        &u64::MAX.to_le_bytes()[..],
        &[5, 0, 0, 0, 0, 0, 0, 0, 1, b'{'][..],
        &[3, 0, 0, 0, 0, 0, 0, 0, 1, b'x', b'y'][..],
        b"GET / HTTP/1.1\r\n\r\n",
        &[][..],
    ] {
        assert!(send_raw(rpc, junk).is_empty(), "{junk:?}");
    }
    // Connection and old-protocol requests get the empty handshake reply.
    let reply = send_raw(rpc, &wire::encode_frame(FrameType::Old, "{}"));
    assert!(reply.len() > 8 && reply[8] == b'{', "old protocol reply has no type byte");
    let reply = send_raw(rpc, &wire::encode_frame(FrameType::Connection, r#"{"qp_num":[1]}"#));
    assert_eq!(reply[8], 0);
    let text = std::str::from_utf8(&reply[9..]).unwrap();
    assert!(text.contains(r#""reply_msg":"""#), "{text}");
    // Data port: a v2 request outside registered memory gets MCTV|1 and a
    // close; a truncated header just a close.
    let data = b.data_port();
    let bad = wire::RequestHeader { size: 10, addr: 8, direction: Direction::Write, acknowledged: true }.encode();
    assert_eq!(send_raw(data, &bad), wire::encode_status(wire::STATUS_REJECTED));
    let zero = wire::RequestHeader { size: 0, addr: addr(&target), direction: Direction::Read, acknowledged: true };
    assert_eq!(send_raw(data, &zero.encode()), wire::encode_status(wire::STATUS_REJECTED));
    assert!(send_raw(data, &bad[..10]).is_empty());
    let wrap =
        wire::RequestHeader { size: u64::MAX, addr: addr(&target), direction: Direction::Read, acknowledged: false };
    assert!(send_raw(data, &wrap.encode()).is_empty());
    // A v2 READ served raw: status then the bytes.
    let good = wire::RequestHeader { size: 4, addr: addr(&target), direction: Direction::Read, acknowledged: true };
    let mut expect = wire::encode_status(0).to_vec();
    expect.extend_from_slice(&target[..4]);
    assert_eq!(send_raw(data, &good.encode()), expect);
    // Still serving real peers.
    let src = pattern(4096, 7);
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, 0, addr(&target), 4096)]) }.unwrap();
    assert!(target == src);
    a.probe(b.session_id()).unwrap();
}

#[test]
fn stop_joins_everything_and_refuses_new_work() {
    let a = engine();
    let b = engine();
    b.probe(a.session_id()).unwrap();
    a.stop();
    a.stop(); // idempotent
    let src = [0u8; 4];
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, 0, 4096, 4)]) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Shutdown);
    assert_eq!(b.probe(a.session_id()).unwrap_err().kind(), ErrorKind::PeerUnreachable);
}

#[test]
fn unregister_withdraws_memory() {
    let (a, b) = (engine(), engine());
    let target = vec![0u8; 4096];
    b.register(addr(&target), 4096).unwrap();
    assert_eq!(b.register(addr(&target) + 10, 10).unwrap_err().kind(), ErrorKind::AddressOverlap);
    b.unregister(addr(&target)).unwrap();
    assert_eq!(b.unregister(addr(&target)).unwrap_err().kind(), ErrorKind::NotFound);
    let src = [1u8; 16];
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let e = unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, 0, addr(&target), 16)]) }
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::RemoteRejected);
    assert_eq!(target[0], 0);
}

#[test]
fn large_entries_travel_as_pieces_and_fail_as_one_task() {
    let (a, b) = (engine(), engine());
    let len = 3 * plan::PIECE_BYTES + 12345;
    let target = vec![0u8; len];
    b.register(addr(&target), len as u64).unwrap();
    let src = pattern(len, 8);
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, 0, addr(&target), len)]) }.unwrap();
    assert!(target == src);
    // The last piece runs past the region: the whole entry fails, once.
    let reqs = vec![req(&src, 0, addr(&target) + 1, len), req(&src, 0, addr(&target), 100)];
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let id = unsafe { a.submit(b.session_id(), Direction::Read, reqs, None) }.unwrap();
    let s = a.batch_wait(id, Duration::from_secs(30)).unwrap();
    assert_eq!((s.state, s.total, s.completed, s.failed), (TaskState::Failed, 2, 1, 1));
    let t = a.task_summary(id, 0).unwrap();
    assert_eq!(t.state, TaskState::Failed);
    assert_eq!(t.error.unwrap().kind(), ErrorKind::RemoteRejected);
    assert!(t.bytes < len as u64, "a failed entry reports only the bytes that moved");
}

#[test]
fn stop_interrupts_work_stuck_on_a_silent_peer() {
    // The default handshake timeout is 30 s; stopping must not wait for it.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let session = silent.local_addr().unwrap().to_string();
    let a = engine();
    let src = [1u8; 8];
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    let id = unsafe { a.submit(&session, Direction::Write, vec![req(&src, 0, 4096, 8)], None) }.unwrap();
    let sync_err = std::thread::scope(|s| {
        // SAFETY: the test's buffers outlive the call (and every batch it starts).
        let sync = s.spawn(|| unsafe { a.transfer_sync(&session, Direction::Write, vec![req(&src, 0, 4096, 8)]) });
        // Work is stuck on the peer once its handshake connection is open
        // (the kernel completes it; nobody answers): wait for that, not a time.
        let _held = accept_within(&silent, Duration::from_secs(20));
        let started = Instant::now();
        a.stop();
        assert!(started.elapsed() < Duration::from_secs(10), "stop took {:?}", started.elapsed());
        sync.join().unwrap().unwrap_err()
    });
    assert_eq!(sync_err.kind(), ErrorKind::Shutdown, "{sync_err}");
    let s = a.batch_wait(id, Duration::ZERO).unwrap();
    assert_eq!(s.state, TaskState::Failed);
    assert_eq!(a.task_summary(id, 0).unwrap().error.unwrap().kind(), ErrorKind::Shutdown);
}

#[test]
fn ipv6_loopback_sessions_are_bracketed_and_work() {
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        // No IPv6 loopback on this machine: an engine cannot listen there
        // either, and says so instead of starting half way.
        eprintln!("no IPv6 loopback on this machine: checking only that an engine on ::1 is refused");
        assert!(Engine::start_with("::1", settings()).is_err(), "an engine started on a missing ::1");
        return;
    }
    let a = Engine::start_with("::1", settings()).unwrap();
    let b = Engine::start_with("[::1]", settings()).unwrap();
    assert!(b.session_id().starts_with("[::1]:"), "{}", b.session_id());
    let target = vec![0u8; 4096];
    b.register(addr(&target), 4096).unwrap();
    let src = pattern(4096, 9);
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, 0, addr(&target), 4096)]) }.unwrap();
    assert!(target == src);
    a.notify(b.session_id(), &Notification::new("v6", "ok")).unwrap();
    assert_eq!(b.drain_notifications(), vec![Notification::new("v6", "ok")]);
}

#[test]
fn soak_mixed_operations_from_many_threads() {
    // Bounded in time: a few seconds of mixed traffic from 4 threads while
    // a fifth keeps withdrawing and re-registering a region the others also
    // hit. Every call must end in a consistent outcome; every byte that was
    // confirmed must be there.
    let (a, b) = (engine(), engine());
    const SLICE: usize = 1 << 20;
    let target = vec![0u8; 4 * SLICE];
    let churn = vec![0u8; SLICE];
    b.register(addr(&target), target.len() as u64).unwrap();
    b.register(addr(&churn), SLICE as u64).unwrap();
    let stop_at = Instant::now() + Duration::from_secs(3);
    let session = b.session_id().to_owned();
    std::thread::scope(|s| {
        s.spawn(|| {
            while Instant::now() < stop_at {
                b.unregister(addr(&churn)).unwrap();
                std::thread::sleep(Duration::from_millis(2));
                b.register(addr(&churn), SLICE as u64).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        for t in 0..4usize {
            let (a, session, target, churn) = (&a, &session, &target, &churn);
            s.spawn(move || {
                let mine = addr(target) + (t * SLICE) as u64;
                let mut k = 0u64;
                while Instant::now() < stop_at {
                    k += 1;
                    let len = 1 + (k as usize * 7919 + t * 104_729) % (SLICE - 1);
                    let src = pattern(len, k ^ t as u64);
                    match k % 5 {
                        0 | 1 => {
                            // SAFETY: the test's buffers outlive the call (and every batch it starts).
                            unsafe { a.transfer_sync(session, Direction::Write, vec![req(&src, 0, mine, len)]) }
                                .unwrap();
                            let mut back = vec![0u8; len];
                            let r = Request { local: back.as_mut_ptr() as usize, remote: mine, len };
                            // SAFETY: the test's buffers outlive the call (and every batch it starts).
                            unsafe { a.transfer_sync(session, Direction::Read, vec![r]) }.unwrap();
                            assert!(back == src, "thread {t} op {k}: read back differs");
                        }
                        2 => {
                            let reqs: Vec<Request> =
                                (0..16).map(|i| req(&src, 0, mine + (i * 4096) as u64, len.min(4096))).collect();
                            // SAFETY: the test's buffers outlive the call (and every batch it starts).
                            let id = unsafe { a.submit(session, Direction::Write, reqs, None) }.unwrap();
                            let s = a.batch_wait(id, Duration::from_secs(30)).unwrap();
                            assert_eq!(s.state, TaskState::Completed);
                            a.batch_free(id).unwrap();
                        }
                        3 => {
                            // The churned region: refused, confirmed, or (when the withdrawal
                            // lands while its bytes are in flight) cut off by the unregister
                            // fence shutting the connection (see regions.rs); never anything else.
                            let n = len.min(SLICE);
                            // SAFETY: the test's buffers outlive the call (and every batch it starts).
                            match unsafe {
                                a.transfer_sync(session, Direction::Write, vec![req(&src, 0, addr(churn), n)])
                            } {
                                Ok(()) => {}
                                Err(e) => assert!(
                                    matches!(e.kind(), ErrorKind::RemoteRejected | ErrorKind::ConnectionLost),
                                    "{e}"
                                ),
                            }
                        }
                        _ => {
                            a.probe(session).unwrap();
                            a.notify(session, &Notification::new("soak", k.to_string())).unwrap();
                        }
                    }
                }
            });
        }
    });
    assert!(!b.drain_notifications().is_empty());
}
