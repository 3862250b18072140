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

/// Peers with rails that die and are forgotten take their rail probes with
/// them: after 40 of them, no probe thread is left and nothing connects to
/// their dead ports (a probe lived as long as the engine before).
#[test]
fn probes_of_dead_peers_stop_once_the_peers_are_forgotten() {
    if !rails::interfaces().unwrap_or_default().iter().any(|r| r.addr.is_ipv4()) {
        eprintln!("SKIP: no interface but loopback is up here");
        return;
    }
    let a = engine(Some("auto"), false);
    let probes = |e: &Engine| {
        (0..rails::MAX_RAILS)
            .map(|i| e.inner.registry.live_threads_named(&format!("pdx-rail-probe-{i}")))
            .sum::<usize>()
    };
    let region = vec![0u8; 64 << 10];
    let src = vec![5u8; 4096];
    let mut probed = 0;
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
        probed = probed.max(probes(&a));
    }
    assert!(probed > 0, "the dead peers' rails were probed");
    let by = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < by && (a.inner.peers.len() > 0 || probes(&a) > 0) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(a.inner.peers.len(), 0, "the dead peers are forgotten");
    assert_eq!(probes(&a), 0, "no probe outlives its peer");
}
