//! Rails between two engines of this process over this machine's own
//! interfaces (`PDX_TCP_RAILS=auto`, same-host link off): data moves over
//! the paired rails and each is counted; a peer without rails, and rails on
//! one side only, keep the one address (no `rails` in `pdx_peer_info`, no
//! `pdx_rails` in the descriptor); a same-host peer keeps its one copy.

use super::net::rails;
use super::*;
use crate::transfer::backend::TransferBackend;

fn engine(rails: Option<&str>, same_host: bool) -> Engine {
    let mut s = Settings::from_env();
    s.tcp_rails = rails.map(str::to_owned);
    s.same_host = same_host;
    Engine::start_with("127.0.0.1", s).expect("engine starts")
}

/// Write 12 MiB to `b` and read it back; true when the bytes match.
fn round_trip(a: &Engine, b: &Engine, region: &[u8]) -> bool {
    let src: Vec<u8> = (0..region.len()).map(|i| (i as u8).wrapping_mul(7) ^ (i >> 16) as u8).collect();
    let w = Request { local: src.as_ptr() as usize, remote: region.as_ptr() as u64, len: src.len() };
    // SAFETY: the buffers outlive the call and every batch it starts.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![w]) }.expect("write");
    let mut back = vec![0u8; src.len()];
    let r = Request { local: back.as_mut_ptr() as usize, remote: region.as_ptr() as u64, len: src.len() };
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, vec![r]) }.expect("read");
    back == src
}

#[test]
fn paired_rails_carry_the_bytes_and_say_so() {
    let found: Vec<_> = rails::interfaces().unwrap_or_default().into_iter().filter(|r| r.addr.is_ipv4()).collect();
    if found.is_empty() {
        eprintln!("SKIP: no interface but loopback is up here");
        return;
    }
    let (a, b) = (engine(Some("auto"), false), engine(Some("auto"), false));
    let own = a.inner.peers.dialer().own_descriptor();
    assert!(own.contains("\"pdx_rails\":["), "{own}");
    let region = vec![0u8; 12 << 20];
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    assert!(round_trip(&a, &b, &region));
    let info = a.peer_info(b.session_id()).unwrap();
    let rails = info["rails"].as_array().expect("rails in pdx_peer_info");
    assert_eq!(rails.len(), found.len().min(rails::MAX_RAILS), "{info}");
    let moved: u64 = rails.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    assert_eq!(moved, 2 * region.len() as u64, "every byte counted on a rail: {info}");
    assert!(
        rails.iter().all(|r| r["state"] == "up" && r["reason"].as_str().unwrap().contains("same subnet")),
        "{info}"
    );
    let scrape = crate::transfer::metrics::render(&a.metrics());
    assert!(scrape.contains("pdx_rail_up{rail=\""), "{scrape}");
}

#[test]
fn without_rails_on_either_side_or_on_one_host_nothing_changes() {
    let region = vec![0u8; 12 << 20];
    let plain = engine(None, false);
    let own = plain.inner.peers.dialer().own_descriptor();
    assert!(!own.contains("pdx_rails"), "{own}");
    assert!(!crate::transfer::metrics::render(&plain.metrics()).contains("rail"));
    if !rails::interfaces().unwrap_or_default().iter().any(|r| r.addr.is_ipv4()) {
        eprintln!("SKIP: no interface but loopback is up here");
        return;
    }
    let railed = engine(Some("auto"), false);
    railed.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    plain.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    for (a, b) in [(&plain, &railed), (&railed, &plain)] {
        assert!(round_trip(a, b, &region));
        let info = a.peer_info(b.session_id()).unwrap();
        assert!(info.get("rails").is_none(), "rails on one side only: one address ({info})");
    }
    // Two engines of one host: the same-host link, never rails.
    let (x, y) = (engine(Some("auto"), true), engine(Some("auto"), true));
    y.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    assert!(round_trip(&x, &y, &region));
    let info = x.peer_info(y.session_id()).unwrap();
    assert!(info.get("rails").is_none(), "{info}");
    assert_eq!(info["path"], "same-host", "{info}");
}

/// A peer that restarts under the same name is paired again from its new
/// descriptor: without rails (an older pdx, or `PDX_TCP_RAILS` unset) one
/// address as before, with rails again its rails, fresh.
#[test]
fn a_peer_restarted_with_other_rails_is_paired_afresh() {
    if !rails::interfaces().unwrap_or_default().iter().any(|r| r.addr.is_ipv4()) {
        eprintln!("SKIP: no interface but loopback is up here");
        return;
    }
    let rpc_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let peer = |rails: Option<&str>| {
        let mut s = Settings::from_env();
        s.tcp_rails = rails.map(str::to_owned);
        s.same_host = false;
        (s.min_port, s.max_port) = (rpc_port, rpc_port);
        Engine::start_with("127.0.0.1", s).expect("engine starts")
    };
    let a = engine(Some("auto"), false);
    let region = vec![0u8; 12 << 20];
    let b = peer(Some("auto"));
    let session = b.session_id().to_owned();
    b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    assert!(round_trip(&a, &b, &region));
    let info = a.peer_info(&session).unwrap();
    let first = info["rails"].as_array().expect("rails").len();
    assert!(first > 0, "{info}");
    drop(b);
    // Restarted without rails: the old pairing is not kept.
    let region2 = vec![0u8; 12 << 20];
    let b2 = peer(None);
    assert_eq!(b2.session_id(), session);
    b2.register(region2.as_ptr() as u64, region2.len() as u64).unwrap();
    assert!(round_trip(&a, &b2, &region2));
    let info = a.peer_info(&session).unwrap();
    assert!(info.get("rails").is_none(), "a peer without rails now: one address ({info})");
    drop(b2);
    // With rails again: paired afresh, every rail up and counting from zero.
    let region3 = vec![0u8; 12 << 20];
    let b3 = peer(Some("auto"));
    b3.register(region3.as_ptr() as u64, region3.len() as u64).unwrap();
    assert!(round_trip(&a, &b3, &region3));
    let info = a.peer_info(&session).unwrap();
    let rails = info["rails"].as_array().expect("rails again");
    assert_eq!(rails.len(), first, "{info}");
    let moved: u64 = rails.iter().map(|r| r["bytes"].as_u64().unwrap()).sum();
    // The write that found the peer restarted ran on the one address of its
    // new descriptor; the read after it on the new pairing, counted afresh.
    let len = region3.len() as u64;
    assert!((len..=2 * len).contains(&moved), "a fresh pairing counts only its own bytes: {info}");
    assert!(rails.iter().all(|r| r["state"] == "up"), "{info}");
}

/// The kernel's count of this thread's network namespace's TCP connects:
/// (`ActiveOpens`, `AttemptFails`) of `/proc/thread-self/net/snmp`.
fn tcp_connects() -> (u64, u64) {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (tcp.next().expect("Tcp names"), tcp.next().expect("Tcp values"));
    let field = |name: &str| {
        let at = names.split_whitespace().position(|n| n == name).expect(name);
        values.split_whitespace().nth(at).and_then(|v| v.parse().ok()).expect(name)
    };
    (field("ActiveOpens"), field("AttemptFails"))
}

/// Run `sh -c script` (in the calling thread's network namespace).
fn sh(script: &str) {
    let out = std::process::Command::new("sh").arg("-c").arg(script).output().expect("sh runs");
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Run `body` on a thread in a network namespace of its own (`lo` up,
/// then `setup` run there), which every engine it starts inherits; `None`
/// (with a line saying why) where this process cannot make one (not root).
fn in_own_netns<T: Send + 'static>(setup: &'static str, body: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    // SAFETY: geteuid reads the process's effective uid.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIP: a network namespace of the test's own needs root");
        return None;
    }
    if !std::process::Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP: no `ip` command (iproute2) to set up a network namespace");
        return None;
    }
    let thread = std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_NEWNET) moves only this thread (and what
        // it starts) into a new network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("SKIP: cannot make a network namespace: {}", std::io::Error::last_os_error());
            return None;
        }
        sh("ip link set lo up");
        sh(setup);
        Some(body())
    });
    thread.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn probe_threads(e: &Engine) -> usize {
    e.inner.registry.live_threads_named(rails::PROBE_THREAD)
}

/// Peers with rails that die and are forgotten take their rail probes with
/// them: while 40 of them die one after another the engine probes with one
/// thread at most, and a few seconds after, no probe thread is left and the
/// kernel counts no connect at all over 3 s (a thread each, connecting
/// about twice a second, lived as long as the engine before). In a network
/// namespace of the test's own, so that the counts are this test's.
#[test]
fn probes_of_dead_peers_stop_once_the_peers_are_forgotten() {
    let setup = "ip link add h45p0 type veth peer name h45p1 && ip addr add 10.45.7.1/24 dev h45p0 && \
                 ip link set h45p0 up && ip link set h45p1 up";
    in_own_netns(setup, || {
        let a = engine(Some("auto"), false);
        let region = vec![0u8; 64 << 10];
        let src = vec![5u8; 4096];
        let (mut probed, mut most) = (false, 0);
        for _ in 0..40 {
            let b = engine(Some("auto"), false);
            b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
            let w = Request { local: src.as_ptr() as usize, remote: region.as_ptr() as u64, len: src.len() };
            // SAFETY: `src` and `region` outlive the synchronous calls.
            unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![w]) }.expect("write");
            let session = b.session_id().to_owned();
            drop(b);
            // The next write finds the rail gone: down, probed, and the write fails.
            // SAFETY: as above.
            assert!(unsafe { a.transfer_sync(&session, Direction::Write, vec![w]) }.is_err());
            let info = a.peer_info(&session).map(|i| i.to_string()).unwrap_or_default();
            probed |= info.contains("\"down\"");
            most = most.max(probe_threads(&a));
        }
        assert!(probed, "the dead peers' rails went down (and were probed)");
        assert!(most <= 1, "one probe thread per engine, whatever the peers: {most}");
        let t0 = std::time::Instant::now();
        let by = t0 + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < by && (a.inner.peers.len() > 0 || probe_threads(&a) > 0) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert_eq!(a.inner.peers.len(), 0, "the dead peers are forgotten");
        assert_eq!(probe_threads(&a), 0, "no probe outlives its peer");
        let before = tcp_connects();
        std::thread::sleep(std::time::Duration::from_secs(3));
        let after = tcp_connects();
        println!(
            "40 dead peers: at most {most} probe thread; none {:?} after the last; connects (opens, fails) {before:?} \
             then {after:?} 3 s later",
            t0.elapsed()
        );
        assert_eq!(before, after, "nothing connects once the peers are gone (the kernel's count)");
    });
}

/// A peer advertises five rails: two that work, one whose address completes
/// the TCP handshake but never answers the pdx hello (a listener in another
/// namespace that reads nothing), and two whose addresses nobody answers
/// (connects hang until the rail's bound). The first batch to it succeeds,
/// byte for byte, within a few seconds: a silent rail costs a lane one
/// connect bound (2 s), never the handshake timeout (30 s) nor the batch.
#[test]
fn the_first_batch_past_silent_and_dead_rails_succeeds_within_seconds() {
    let setup = "ip link add h45s0 type veth peer name h45s1 && ip link set h45s0 up && \
                 for i in 1 2 3 4 5; do ip addr add 10.45.8.$i/24 dev h45s0; done";
    in_own_netns(setup, || {
        let mut s = Settings::from_env();
        s.same_host = false;
        s.tcp_rails = Some("10.45.8.2,10.45.8.3,10.45.8.4,10.45.8.5,10.45.8.1".into());
        let b = Engine::start_with("127.0.0.1", s).expect("engine starts");
        let port = b.data_port();
        // The silent and dead rails' addresses leave this namespace: .3 to
        // another one, where a listener completes handshakes and reads
        // nothing; .4 and .5 to nobody (no one answers ARP for them).
        sh("for i in 3 4 5; do ip addr del 10.45.8.$i/24 dev h45s0; done");
        let (tx, rx) = std::sync::mpsc::channel::<i32>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let silent = std::thread::spawn(move || {
            // SAFETY: moves only this thread into a new network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "{}", std::io::Error::last_os_error());
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = rx_ready(&stop_rx);
            sh("ip link set lo up && ip addr add 10.45.8.3/24 dev h45s1 && ip link set h45s1 up");
            let listener = std::net::TcpListener::bind(("10.45.8.3", port)).expect("the silent listener");
            let _ = stop_rx.recv_timeout(std::time::Duration::from_secs(60));
            drop(listener);
        });
        let tid = rx.recv().unwrap();
        sh(&format!("ip link set h45s1 netns {tid}"));
        stop_tx.send(()).unwrap();
        // Let the silent host come up (it takes a handshake).
        let by = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < by
            && std::net::TcpStream::connect_timeout(
                &(std::net::Ipv4Addr::new(10, 45, 8, 3), port).into(),
                std::time::Duration::from_millis(200),
            )
            .is_err()
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let mut s = Settings::from_env();
        s.same_host = false;
        s.tcp_rails = Some("10.45.8.1".into());
        let a = Engine::start_with("127.0.0.1", s).expect("engine starts");
        let region = vec![0u8; 64 << 20];
        b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        let src: Vec<u8> = (0..region.len()).map(|i| (i as u8).wrapping_mul(13) ^ (i >> 12) as u8).collect();
        let w = Request { local: src.as_ptr() as usize, remote: region.as_ptr() as u64, len: src.len() };
        let t0 = std::time::Instant::now();
        // SAFETY: `src` and `region` outlive the synchronous call.
        let wrote = unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![w]) };
        let took = t0.elapsed();
        let info = a.peer_info(b.session_id()).map(|i| i.to_string()).unwrap_or_default();
        println!("first batch (64 MiB) past 1 silent and 2 dead rails: {wrote:?} in {took:?}; {info}");
        stop_tx.send(()).unwrap();
        drop(silent.join());
        wrote.expect("the first batch succeeds");
        assert!(region == src, "every byte arrived");
        assert!(took < std::time::Duration::from_secs(5), "the first batch took {took:?}");
        let rails = serde_json::from_str::<serde_json::Value>(&info).ok().and_then(|i| i["rails"].as_array().cloned());
        let rails = rails.expect("rails in pdx_peer_info");
        let reason = |remote: &str| {
            let r = rails.iter().find(|r| r["remote"] == remote).expect(remote);
            assert_eq!(r["state"], "dropped", "{remote}: {info}");
            r["reason"].as_str().unwrap_or_default().to_owned()
        };
        let silent = reason("10.45.8.3");
        assert!(silent.contains("no answer to the pdx hello") && silent.contains("-> 10.45.8.3"), "{silent}");
        for dead in ["10.45.8.4", "10.45.8.5"] {
            assert!(reason(dead).contains(&format!("-> {dead}")), "{info}");
        }
    });
}

/// Wait for the go-ahead on `rx` (bounded).
fn rx_ready(rx: &std::sync::mpsc::Receiver<()>) -> bool {
    rx.recv_timeout(std::time::Duration::from_secs(10)).is_ok()
}

/// A read and a write cancelled while on the wire over two rails (in a
/// network namespace of the test's own): no late byte lands in the read's
/// buffer, no byte of the write's source is read after the cancel, and the
/// rails stay up (a cut lane says nothing against its rail); the peer
/// serves on at once.
#[test]
fn a_cancel_over_rails_touches_no_local_byte_and_leaves_the_rails_up() {
    let setup = "ip link add c50a type veth peer name c50b && ip addr add 10.50.1.1/24 dev c50a && \
                 ip addr add 10.50.1.2/24 dev c50b && ip link set c50a up && ip link set c50b up";
    in_own_netns(setup, || {
        let (a, b) = (engine(Some("auto"), false), engine(Some("auto"), false));
        let warm = vec![0u8; 12 << 20];
        b.register(warm.as_ptr() as u64, warm.len() as u64).unwrap();
        assert!(round_trip(&a, &b, &warm), "rails paired by a first batch");
        let region: Vec<u8> = (0..128usize << 20).map(|i| ((i * 131 + (i >> 12)) & 0x7f) as u8).collect();
        let target = vec![0u8; 128 << 20];
        b.register(region.as_ptr() as u64, region.len() as u64).unwrap();
        b.register(target.as_ptr() as u64, target.len() as u64).unwrap();
        assert!(round_trip(&a, &b, &warm), "the descriptor with the new regions in hand");
        let on_rails = |info: &serde_json::Value| -> u64 {
            let rails = info["rails"].as_array().expect("rails in pdx_peer_info");
            assert!(rails.len() >= 2 && rails.iter().all(|r| r["state"] == "up"), "the rails stay up: {info}");
            rails.iter().map(|r| r["bytes"].as_u64().unwrap()).sum()
        };
        let before = on_rails(&a.peer_info(b.session_id()).unwrap());
        let read = super::cancel_tests::cancel_read(&a, b.session_id(), &region, 8 << 20);
        assert!(on_rails(&read.info) >= before + (8 << 20), "the read moved over the rails: {}", read.info);
        let write = super::cancel_tests::cancel_write(&a, b.session_id(), &target, 8 << 20);
        on_rails(&write.info);
        println!("over rails: cancelled a read in {:?}, a write in {:?}", read.took, write.took);
        assert!(round_trip(&a, &b, &warm), "the peer serves on");
    });
}
