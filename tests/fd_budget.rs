//! With `ulimit -n 1024` and 2000 idle connections from a stranger, a new
//! peer probes, writes and reads within 2 s and the victim's own outbound
//! work succeeds. The stranger is this test binary run again as a child
//! (its own descriptor limit), so the victim's limit is this process's.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pdx::engine::settings::Settings;
use pdx::engine::Engine;
use pdx::transfer::{Direction, Request, TransferBackend};

const ATTACKER: &str = "PDX_TEST_IDLE_ATTACKER_PORT";

/// Poll `done` until it holds or `limit` passes; whether it held.
fn wait_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn set_fd_limit(soft: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write one local rlimit.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_cur = soft.min(lim.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
    }
}

/// The child: open 2000 idle connections to the port, report, then wait.
fn attacker(port: u16) {
    set_fd_limit(4096);
    let mut held = Vec::new();
    for _ in 0..2000 {
        match TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)) {
            Ok(s) => held.push(s),
            Err(e) => {
                println!("connect failed: {e}");
                break;
            }
        }
    }
    println!("ready {}", held.len());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn two_thousand_idle_connections_under_ulimit_1024() {
    if let Ok(port) = std::env::var(ATTACKER) {
        attacker(port.parse().unwrap());
        return;
    }
    set_fd_limit(1024);
    let victim = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
    let (fds0, threads0) = (count("/proc/self/fd"), threads());
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "two_thousand_idle_connections_under_ulimit_1024", "--nocapture", "--test-threads", "1"])
        .env(ATTACKER, victim.data_port().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let opened = loop {
        let line = lines.next().expect("the attacker reports").unwrap();
        // libtest prints the test's name first, on the same line.
        if let Some(at) = line.find("ready ") {
            break line[at + 6..].trim().parse::<usize>().unwrap();
        }
    };
    // Let the victim accept them all: wait until its accept loops have taken
    // every connection (admitted or closed by the budget), not for a time.
    let accepted = wait_until(Duration::from_secs(20), || victim.stats().inbound_connections >= opened as u64);
    let (fds1, threads1) = (count("/proc/self/fd"), threads());
    // A new peer: probe, write, read, each within 2 s.
    let newcomer = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
    let region = vec![0u8; 1 << 20];
    victim.register(region.as_ptr() as u64, region.len() as u64).unwrap();
    let src = vec![0x5au8; 1 << 20];
    let mut back = vec![0u8; 1 << 20];
    let t0 = Instant::now();
    newcomer.probe(victim.session_id()).unwrap();
    let probe = t0.elapsed();
    let w = Request { local: src.as_ptr() as usize, remote: region.as_ptr() as u64, len: src.len() };
    // SAFETY: `src`, `back` and `region` outlive the calls.
    unsafe { newcomer.transfer_sync(victim.session_id(), Direction::Write, vec![w]) }.unwrap();
    let write = t0.elapsed();
    let r = Request { local: back.as_mut_ptr() as usize, remote: region.as_ptr() as u64, len: back.len() };
    // SAFETY: as above.
    unsafe { newcomer.transfer_sync(victim.session_id(), Direction::Read, vec![r]) }.unwrap();
    let read = t0.elapsed();
    assert!(back == src && region == src);
    // The victim's own outbound work.
    let theirs = vec![0u8; 1 << 20];
    newcomer.register(theirs.as_ptr() as u64, theirs.len() as u64).unwrap();
    let o = Request { local: src.as_ptr() as usize, remote: theirs.as_ptr() as u64, len: src.len() };
    // SAFETY: `src` and `theirs` outlive the call.
    unsafe { victim.transfer_sync(newcomer.session_id(), Direction::Write, vec![o]) }.unwrap();
    assert!(theirs == src);
    drop(newcomer);
    let _ = child.kill();
    let _ = child.wait();
    // The stranger and the newcomer are gone: wait until the victim has
    // closed every inbound connection it still held from them.
    let closed = wait_until(Duration::from_secs(20), || victim.stats().gauges.inbound_connections_open == 0);
    let (fds2, threads2) = (count("/proc/self/fd"), threads());
    println!(
        "{opened} idle connections under ulimit -n 1024: probe {probe:?}, write {:?}, read {:?}; \
         victim fds {fds0} -> {fds1} (under attack) -> {fds2} (after), threads {threads0} -> {threads1} -> {threads2}",
        write - probe,
        read - write
    );
    assert_eq!(opened, 2000, "the stranger opened every connection");
    assert!(accepted, "the victim's accept loops took every connection (admitted or closed)");
    assert!(closed, "the victim closed every connection of the peers that went away");
    assert!(read < Duration::from_secs(2), "{read:?}");
    assert!(fds1 < 1024 / 4 + fds0 + 64, "inbound connections stay within a quarter of the limit: {fds1}");
    drop(victim);
}
