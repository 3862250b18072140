//! A peer sending 4096 notifications of 1 MiB cannot grow the receiver
//! past its byte budget: the receiver's RSS stays under 256 MiB, the
//! notifications over the budget are refused (the sender sees
//! `NotifyRejected`) and every accepted one is drained. Its own test binary,
//! so the process's RSS is this test's alone.

use std::time::Instant;

use pdx::engine::settings::Settings;
use pdx::engine::Engine;
use pdx::transfer::{Notification, TransferBackend};
use pdx::ErrorKind;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("resident pages");
    pages * 4096
}

#[test]
fn four_thousand_one_mib_notifications_stay_within_the_budget() {
    let receiver = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
    let sender = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
    let msg = "m".repeat((1 << 20) - 100); // the largest that fits a 1 MiB frame
    let before = rss_bytes();
    let started = Instant::now();
    let (mut accepted, mut refused, mut peak) = (0usize, 0usize, before);
    for i in 0..4096 {
        match sender.notify(receiver.session_id(), &Notification::new("kv", msg.as_str())) {
            Ok(()) => accepted += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::NotifyRejected, "notification {i}: {e}");
                refused += 1;
            }
        }
        if i % 64 == 0 {
            peak = peak.max(rss_bytes());
        }
    }
    peak = peak.max(rss_bytes());
    let drained = receiver.drain_notifications();
    println!(
        "4096 x 1 MiB: {accepted} accepted, {refused} refused in {:.1} s; RSS {} MiB before, peak {} MiB",
        started.elapsed().as_secs_f64(),
        before >> 20,
        peak >> 20
    );
    assert_eq!(drained.len(), accepted, "accepted == drained");
    assert!(drained.iter().all(|n| n.name == b"kv" && n.msg.len() == msg.len()));
    assert!((1..=8).contains(&accepted), "the default budget is 8 MiB: {accepted} accepted");
    assert_eq!(accepted + refused, 4096);
    assert!(peak < 256 << 20, "peak RSS {} MiB", peak >> 20);
    // The budget is free again once drained.
    sender.notify(receiver.session_id(), &Notification::new("kv", msg.as_str())).unwrap();
    assert_eq!(receiver.drain_notifications().len(), 1);
}
