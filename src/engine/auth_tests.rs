//! Who may connect (issue 23): the allowlist on the data port, and peer
//! authentication against parties without the secret and against replays
//! of recorded connections. Loopback only; every wait is bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use super::protocol::hello;
use super::protocol::wire::RequestHeader;
use super::*;

fn secret_file(dir: &std::path::Path, name: &str, fill: u8) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, vec![fill; 40]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_str().unwrap().to_owned()
}

fn engine(secret: Option<&str>, allowed: Option<&str>) -> Engine {
    let mut s = Settings::from_env();
    s.peer_secret_file = secret.map(str::to_owned);
    s.allowed_peers = allowed.map(str::to_owned);
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

fn req(local: &[u8], remote: u64) -> Request {
    Request { local: local.as_ptr() as usize, remote, len: local.len() }
}

/// Read until the peer closes (or 5 s pass); what arrived.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A v2 write of `payload` to `addr`, as a Mooncake peer sends it.
fn raw_write(addr: u64, payload: &[u8]) -> Vec<u8> {
    let h = RequestHeader { size: payload.len() as u64, addr, direction: Direction::Write, acknowledged: true };
    let mut out = h.encode().to_vec();
    out.extend_from_slice(payload);
    out
}

#[test]
fn the_allowlist_closes_the_data_port_to_other_addresses_unread() {
    let b = engine(None, Some("127.0.0.1/32"));
    let target = vec![0u8; 4096];
    b.register(target.as_ptr() as u64, 4096).unwrap();
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::from(([127, 0, 0, 2], 0)).into()).unwrap();
    sock.connect(&SocketAddr::from(([127, 0, 0, 1], b.data_port())).into()).unwrap();
    let mut s: TcpStream = sock.into();
    let _ = s.write_all(&raw_write(target.as_ptr() as u64, &[9u8; 64]));
    assert!(read_to_close(&mut s).is_empty());
    wait_for("refusal counted", || b.inner.stats.connections_refused_address.load(Relaxed) == 1);
    assert!(target.iter().all(|&x| x == 0), "nothing was written");
    assert_eq!(b.inner.stats.inbound_connections.load(Relaxed), 0, "never served");
}

#[test]
fn without_the_secret_nothing_is_read_written_or_notified_and_with_it_both_ways_work() {
    let dir = tempfile::tempdir().unwrap();
    let (k, other) = (secret_file(dir.path(), "k", b'k'), secret_file(dir.path(), "o", b'o'));
    let (a, b) = (engine(Some(&k), None), engine(Some(&k), None));
    let target = vec![0u8; 4096];
    b.register(target.as_ptr() as u64, 4096).unwrap();
    let remote = target.as_ptr() as u64;
    let src = vec![5u8; 1000];
    // SAFETY: `src` and `target` outlive the synchronous calls.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, remote)]) }.unwrap();
    assert!(target[..1000].iter().all(|&x| x == 5));
    let mut back = vec![0u8; 1000];
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, vec![req(&back, remote)]) }.unwrap();
    back.truncate(1000);
    assert!(back.iter().all(|&x| x == 5));
    a.notify(b.session_id(), &Notification::new("n", "m")).unwrap();
    assert_eq!(b.drain_notifications(), vec![Notification::new("n", "m")]);
    // The other direction too.
    let own = [0u8; 64];
    a.register(own.as_ptr() as u64, 64).unwrap();
    // SAFETY: as above.
    unsafe { b.transfer_sync(a.session_id(), Direction::Write, vec![req(&src[..64], own.as_ptr() as u64)]) }.unwrap();

    for (who, stranger) in [("no secret", engine(None, None)), ("another secret", engine(Some(&other), None))] {
        let before = b.inner.stats.connections_refused_auth.load(Relaxed);
        let junk = vec![7u8; 100];
        // SAFETY: as above.
        let w = unsafe { stranger.transfer_sync(b.session_id(), Direction::Write, vec![req(&junk, remote)]) };
        let e = w.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PeerUnreachable, "{who}: {e}");
        assert!(e.message().contains("authentication failed"), "{who}: {e}");
        // SAFETY: as above.
        let r = unsafe { stranger.transfer_sync(b.session_id(), Direction::Read, vec![req(&junk, remote)]) };
        assert!(r.is_err(), "{who}");
        assert!(stranger.notify(b.session_id(), &Notification::new("n", "stranger")).is_err(), "{who}");
        assert!(stranger.probe(b.session_id()).is_err(), "{who}");
        // And this engine does not talk to it either.
        // SAFETY: as above.
        let back = unsafe { b.transfer_sync(stranger.session_id(), Direction::Read, vec![req(&back, 4096)]) };
        assert!(back.unwrap_err().message().contains("authentication failed"), "{who}");
        assert!(target[..1000].iter().all(|&x| x == 5) && target[1000..].iter().all(|&x| x == 0), "{who}");
        assert!(b.drain_notifications().is_empty(), "{who}");
        assert!(b.inner.stats.connections_refused_auth.load(Relaxed) > before, "{who}");
    }
    wait_for("only the authenticated write was served", || b.inner.stats.served_writes.load(Relaxed) == 1);
}

/// What a client sent through the proxy, and whether it has closed.
type Recorded = Arc<StdMutex<Vec<(Vec<u8>, bool)>>>;

/// Forwards connections to `to`, recording what each client sent.
fn recording_proxy(to: SocketAddr) -> (u16, Recorded) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sent = Arc::new(StdMutex::new(Vec::new()));
    let sent2 = sent.clone();
    std::thread::spawn(move || {
        for client in listener.incoming().take(8) {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(to) else { return };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let index = {
                let mut v = sent2.lock().unwrap();
                v.push((Vec::new(), false));
                v.len() - 1
            };
            let rec = sent2.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = client.read(&mut buf) {
                    if n == 0 || server.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    rec.lock().unwrap()[index].0.extend_from_slice(&buf[..n]);
                }
                rec.lock().unwrap()[index].1 = true;
                let _ = server.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    (port, sent)
}

#[test]
fn replayed_handshakes_and_data_connections_achieve_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let k = secret_file(dir.path(), "k", b'k');
    let b = engine(Some(&k), None);
    let mut target = vec![0u8; 4096];
    b.register(target.as_ptr() as u64, 4096).unwrap();
    let remote = target.as_ptr() as u64;

    // A handshake recorded on its way to b, then replayed.
    let (hs_port, hs_sent) = recording_proxy(SocketAddr::from(([127, 0, 0, 1], b.rpc_port())));
    let a = engine(Some(&k), None);
    a.probe(&format!("127.0.0.1:{hs_port}")).unwrap();
    wait_for("the probe is recorded", || hs_sent.lock().unwrap().first().is_some_and(|r| r.1));
    wait_for("the probe is counted", || b.inner.stats.handshakes.load(Relaxed) == 1);
    let recorded = hs_sent.lock().unwrap()[0].0.clone();
    assert!(!recorded.is_empty());
    let handshakes = b.inner.stats.handshakes.load(Relaxed);
    let mut s = TcpStream::connect(("127.0.0.1", b.rpc_port())).unwrap();
    s.write_all(&recorded).unwrap();
    let answer = read_to_close(&mut s);
    let challenge = super::protocol::auth::decode_frame_body(&answer[8..]).expect("only the challenge comes back");
    assert!(challenge.server_nonce.is_some());
    assert_eq!(answer.len(), 8 + u64::from_le_bytes(answer[..8].try_into().unwrap()) as usize, "nothing more");
    assert_eq!(b.inner.stats.handshakes.load(Relaxed), handshakes, "the replayed probe was not answered");

    // A data connection recorded (hello, proof, a write), then replayed.
    let (data_port, data_sent) = recording_proxy(SocketAddr::from(([127, 0, 0, 1], b.data_port())));
    let mut stream = TcpStream::connect(("127.0.0.1", data_port)).unwrap();
    let by = Instant::now() + Duration::from_secs(10);
    let secret = super::server::access::read_secret(&k).unwrap();
    super::protocol::hello::confirm(&mut stream, &b.inner.identity.instance, by, "test", Some(&secret), None).unwrap();
    stream.write_all(&raw_write(remote, &[3u8; 256])).unwrap();
    let mut status = [0u8; 8];
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.read_exact(&mut status).unwrap();
    assert_eq!(super::protocol::wire::decode_status(status), Some(super::protocol::wire::STATUS_OK));
    drop(stream);
    assert!(target[..256].iter().all(|&x| x == 3), "the genuine connection wrote");
    // Clear the target through the engine-visible memory, then replay.
    target[..256].fill(0);
    wait_for("the recording is whole", || data_sent.lock().unwrap().first().is_some_and(|r| r.1));
    let recorded = data_sent.lock().unwrap()[0].0.clone();
    let refused = b.inner.stats.connections_refused_auth.load(Relaxed);
    let mut s = TcpStream::connect(("127.0.0.1", b.data_port())).unwrap();
    let _ = s.write_all(&recorded);
    let _ = read_to_close(&mut s);
    wait_for("the replay is refused", || b.inner.stats.connections_refused_auth.load(Relaxed) > refused);
    assert!(target.iter().all(|&x| x == 0), "the replayed write changed nothing");

    // A Mooncake-style connection (no hello) is refused before it is served.
    let mut s = TcpStream::connect(("127.0.0.1", b.data_port())).unwrap();
    let _ = s.write_all(&raw_write(remote, &[4u8; 64]));
    assert!(read_to_close(&mut s).is_empty(), "no status frame");
    assert!(target.iter().all(|&x| x == 0));
    wait_for("only the genuine write was served", || b.inner.stats.served_writes.load(Relaxed) == 1);
}

/// A same-host offer in a hello that has not proven the secret: the
/// target reads nothing of it (no `/proc` read, no probe copy: the offer's
/// unique probe address never reaches the check) and says nothing about
/// the link; two engines with the secret still get the link.
#[test]
fn an_unauthenticated_same_host_offer_is_never_checked_or_answered() {
    let dir = tempfile::tempdir().unwrap();
    let k = secret_file(dir.path(), "k", b'k');
    let (a, b) = (engine(Some(&k), None), engine(Some(&k), None));
    let target = vec![0u8; 1 << 20];
    b.register(target.as_ptr() as u64, target.len() as u64).unwrap();
    let src = vec![9u8; 256 << 10];
    // SAFETY: `src` and `target` outlive the synchronous call.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![req(&src, target.as_ptr() as u64)]) }.unwrap();
    let info = a.peer_info(b.session_id()).unwrap();
    assert_eq!(info["path"], "same-host", "{info}");

    let offer = samehost::offer_or_why_not(true, samehost::HostIdentity::current().as_ref()).unwrap();
    let marker = 0x7eed_0000_0000 + u64::from(std::process::id());
    let instance = b.inner.identity.instance.clone();
    for (nonce, with_proof) in [(None, false), (Some("0".repeat(32)), false), (Some("0".repeat(32)), true)] {
        for after_proof in [false, true] {
            let offer = samehost::Offer { probe_addr: marker, answer_after_proof: after_proof, ..offer.clone() };
            let body = hello::Body {
                instance: Some(instance.clone()),
                nonce: nonce.clone(),
                same_host: Some(offer),
                ..hello::Body::default()
            };
            let mut s = TcpStream::connect(("127.0.0.1", b.data_port())).unwrap();
            s.write_all(&hello::encode_request_body(&body)).unwrap();
            if with_proof {
                // A proof made without the secret.
                let bad = hello::Body { proof: Some("00".repeat(32)), ..hello::Body::default() };
                let _ = s.write_all(&hello::encode_request_body(&bad));
            }
            let got = read_to_close(&mut s);
            let text = String::from_utf8_lossy(&got);
            let reply = got.get(8..).and_then(hello::decode);
            let answered = reply.as_ref().and_then(|r| r.same_host_answer.as_ref());
            // Only the refusal of an older pdx's offer, unchecked, may appear.
            if let Some(answer) = answered {
                assert!(!answer.accepted && answer.reason.contains("only after"), "{answer:?}");
            }
            assert!(!text.contains("probe") && !text.contains("uid"), "{text}");
        }
    }
    assert!(!samehost::EVALUATED.lock().contains(&marker), "an unauthenticated offer was checked");
}

/// `/proc` files pass `stat` as regular files (mode 0400, size 0) but are
/// not secrets: refused by their filesystem, unread (`/proc/kmsg`, which a
/// read would consume, included).
#[test]
fn a_proc_file_is_no_secret() {
    for path in ["/proc/self/environ", "/proc/kmsg"] {
        if std::fs::metadata(path).is_err() {
            continue;
        }
        let e = super::server::access::read_secret(path).unwrap_err();
        assert!(e.message().contains("procfs") && e.message().contains("not a file of stored bytes"), "{e}");
    }
}
