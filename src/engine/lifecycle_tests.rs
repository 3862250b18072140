//! Peers that restart, die or hand their ports to others: a transfer lands
//! in the engine it was planned against or fails, and what an engine holds
//! for peers it no longer talks to goes away.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::initiator::peers;
use super::protocol::descriptor::{encode_descriptor, AdvertisedBuffer};
use super::protocol::wire::{check_frame_length, encode_frame, split_frame_body};
use super::*;

fn engine_on(rpc: Option<u16>, data: Option<u16>) -> Engine {
    let mut s = Settings::from_env();
    s.force_v1 = false;
    if let Some(p) = rpc {
        (s.min_port, s.max_port) = (p, p);
    }
    if let Some(p) = data {
        (s.min_data_port, s.max_data_port) = (p, p);
    }
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

/// A port nothing listens on now.
pub(super) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn write(from: &Engine, session: &str, src: &[u8], remote: u64) -> Result<()> {
    let r = Request { local: src.as_ptr() as usize, remote, len: src.len() };
    // SAFETY: the test's buffers outlive the call.
    unsafe { from.transfer_sync(session, Direction::Write, vec![r]) }
}

fn served_writes(e: &Engine) -> u64 {
    e.stats().served_writes
}

/// `e`'s served writes once they reach `n` (a target counts a write just
/// after acknowledging it), or what they are after 2 s.
fn served_writes_reaching(e: &Engine, n: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(2);
    while served_writes(e) < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    served_writes(e)
}

#[test]
fn a_reused_data_port_never_takes_writes_meant_for_a_restarted_peer() {
    let (rpc, data, data2) = (free_port(), free_port(), free_port());
    let b = engine_on(None, None);
    let buf = vec![0u8; 4096];
    let remote = buf.as_ptr() as u64;
    let a1 = engine_on(Some(rpc), Some(data));
    a1.register(remote, buf.len() as u64).unwrap();
    let session = a1.session_id().to_owned();
    write(&b, &session, &[1u8; 64], remote).unwrap();
    drop(a1);
    // Another engine takes A1's data port and registers the same range; A
    // restarts under its old name with a new data port.
    let c = engine_on(None, Some(data));
    c.register(remote, buf.len() as u64).unwrap();
    let a2 = engine_on(Some(rpc), Some(data2));
    a2.register(remote, buf.len() as u64).unwrap();
    assert_eq!(a2.session_id(), session);
    for round in 1..=3 {
        write(&b, &session, &[2u8; 64], remote).unwrap();
        assert_eq!(served_writes_reaching(&a2, round), round, "write {round} lands in the restarted peer");
        assert_eq!(served_writes(&c), 0, "never in the engine that took the old port");
    }
}

#[test]
fn a_pdx_peer_that_is_gone_fails_clearly_when_its_name_is_not_taken_again() {
    let (rpc, data) = (free_port(), free_port());
    let b = engine_on(None, None);
    let buf = vec![0u8; 4096];
    let a = engine_on(Some(rpc), Some(data));
    a.register(buf.as_ptr() as u64, buf.len() as u64).unwrap();
    let session = a.session_id().to_owned();
    write(&b, &session, &[1u8; 64], buf.as_ptr() as u64).unwrap();
    drop(a);
    // Only the data port is taken again; nobody answers at the session.
    let c = engine_on(None, Some(data));
    c.register(buf.as_ptr() as u64, buf.len() as u64).unwrap();
    let t0 = Instant::now();
    let e = write(&b, &session, &[2u8; 64], buf.as_ptr() as u64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PeerUnreachable, "{e}");
    assert!(e.message().contains("not") && e.message().contains("re-fetching"), "{e}");
    assert_eq!(served_writes(&c), 0);
    let bound = b.inner.settings.connect_timeout.max(b.inner.settings.handshake_timeout);
    assert!(t0.elapsed() < bound + Duration::from_secs(1), "{:?}", t0.elapsed());
}

/// A handshake server that answers Metadata with whatever `desc` holds now
/// and counts the requests (a Mooncake peer: no instance in its descriptor).
pub(super) fn fake_mooncake_session(desc: Arc<Mutex<String>>, fetches: Arc<AtomicUsize>) -> String {
    let rpc = TcpListener::bind("127.0.0.1:0").unwrap();
    let session = format!("127.0.0.1:{}", rpc.local_addr().unwrap().port());
    std::thread::spawn(move || {
        for stream in rpc.incoming() {
            let Ok(mut s) = stream else { return };
            let mut prefix = [0u8; 8];
            if s.read_exact(&mut prefix).is_err() {
                continue;
            }
            let Ok(len) = check_frame_length(prefix, 1 << 20) else { continue };
            let mut body = vec![0u8; len];
            if s.read_exact(&mut body).is_err() {
                continue;
            }
            let (kind, _) = split_frame_body(&body);
            let reply = match kind {
                FrameType::Metadata => {
                    fetches.fetch_add(1, Ordering::SeqCst);
                    desc.lock().clone()
                }
                _ => r#"{"status":"success"}"#.to_owned(),
            };
            let _ = s.write_all(&encode_frame(kind, &reply));
        }
    });
    session
}

/// Mooncake's descriptor: no `pdx_instance`.
pub(super) fn mooncake_descriptor(session: &str, data_port: u16, buf: &[u8]) -> String {
    let with = encode_descriptor(
        session,
        "00",
        "127.0.0.1",
        data_port,
        &[AdvertisedBuffer { addr: buf.as_ptr() as u64, length: buf.len() as u64 }],
    );
    let mut v: serde_json::Value = serde_json::from_str(&with).unwrap();
    v.as_object_mut().unwrap().remove("pdx_instance");
    v.to_string()
}

#[test]
fn a_mooncake_peer_is_fetched_again_before_a_new_data_connection() {
    let buf = vec![0u8; 4096];
    let remote = buf.as_ptr() as u64;
    let (x_port, y) = (free_port(), engine_on(None, None));
    y.register(remote, buf.len() as u64).unwrap();
    let x = engine_on(None, Some(x_port));
    x.register(remote, buf.len() as u64).unwrap();
    let (desc, fetches) = (Arc::new(Mutex::new(String::new())), Arc::new(AtomicUsize::new(0)));
    let session = fake_mooncake_session(desc.clone(), fetches.clone());
    *desc.lock() = mooncake_descriptor(&session, x_port, &buf);
    let b = engine_on(None, None);
    write(&b, &session, &[1u8; 64], remote).unwrap();
    assert_eq!(served_writes_reaching(&x, 1), 1);
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "the first lane uses the first fetch");
    // The peer "restarts" at Y's data port; X's port goes to another engine.
    drop(x);
    let x2 = engine_on(None, Some(x_port));
    x2.register(remote, buf.len() as u64).unwrap();
    *desc.lock() = mooncake_descriptor(&session, y.data_port(), &buf);
    write(&b, &session, &[2u8; 64], remote).unwrap();
    assert_eq!(served_writes_reaching(&y, 1), 1, "the new lane went where the fresh descriptor says");
    assert_eq!(served_writes(&x2), 0);
    assert_eq!(fetches.load(Ordering::SeqCst), 2);
    // A pooled, live lane needs no fetch.
    write(&b, &session, &[3u8; 64], remote).unwrap();
    assert_eq!((served_writes_reaching(&y, 2), fetches.load(Ordering::SeqCst)), (2, 2));
}

#[test]
fn dead_peers_are_forgotten_and_their_lanes_closed() {
    let b = engine_on(None, None);
    let buf = vec![0u8; 4096];
    for _ in 0..20 {
        let a = engine_on(None, None);
        a.register(buf.as_ptr() as u64, buf.len() as u64).unwrap();
        write(&b, a.session_id(), &[1u8; 64], buf.as_ptr() as u64).unwrap();
    }
    assert!(b.inner.peers.len() > 0);
    let deadline = Instant::now() + peers::PEER_IDLE + peers::SWEEP_INTERVAL * 4 + Duration::from_secs(2);
    while b.inner.peers.len() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(b.inner.peers.len(), 0, "every dead peer forgotten");
    assert_eq!(b.inner.registry.socket_count(), 0, "no lane to a dead peer left open");
}
