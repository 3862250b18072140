//! The engine's two listening sockets: bound at a random port of a range, as
//! Mooncake picks its ports, and woken when the engine stops.

use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};

use crate::error::{Error, Result};

/// Pending connections a listener holds before the kernel drops SYNs
/// (clamped by `net.core.somaxconn`). The standard library's 128 is too few
/// for hundreds of peers opening their lanes at once: each dropped SYN or
/// handshake ACK costs the peer a retransmit of a second or more (256
/// engines of four lanes against one target: 2746 drops, rounds of 1.7 s).
const BACKLOG: i32 = 4096;

/// Bind a listener on `ip` at a random port in `[min, max]`, as Mooncake
/// picks ports (up to 500 tries).
pub fn bind_in_range(ip: IpAddr, min: u16, max: u16) -> Result<TcpListener> {
    let mut last_err = None;
    for _ in 0..500 {
        let port = fastrand::u16(min..=max);
        match TcpListener::bind(SocketAddr::new(ip, port)) {
            // Listening again only changes the backlog.
            Ok(l) => match socket2::SockRef::from(&l).listen(BACKLOG) {
                Ok(()) => return Ok(l),
                Err(e) => last_err = Some(e),
            },
            Err(e) => last_err = Some(e),
        }
    }
    Err(Error::io(format!(
        "could not bind a port on {ip} in {min}..={max} after 500 tries: {}",
        last_err.map(|e| e.to_string()).unwrap_or_default()
    )))
}

/// Wake a thread blocked in `accept` on `listener` (Linux returns EINVAL).
pub fn wake_listener(listener: &TcpListener) {
    let _ = socket2::SockRef::from(listener).shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpStream};
    use std::time::Duration;

    use super::*;

    /// More peers than the standard library's backlog of 128 connect before
    /// anything is accepted, and the kernel completes every handshake: none
    /// has its SYN dropped (which would stall its connect for a second).
    #[test]
    fn hundreds_of_connects_wait_in_the_backlog() {
        const PEERS: usize = 300;
        let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        if somaxconn < PEERS + 8 {
            eprintln!("SKIP: net.core.somaxconn is {somaxconn}, under {PEERS} connections");
            return;
        }
        let listener = bind_in_range(IpAddr::V4(Ipv4Addr::LOCALHOST), 20000, 60000).unwrap();
        let addr = listener.local_addr().unwrap();
        let peers: Vec<TcpStream> = (0..PEERS)
            .map(|i| {
                TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                    .unwrap_or_else(|e| panic!("connection {i} of {PEERS}: {e}"))
            })
            .collect();
        listener.set_nonblocking(true).unwrap();
        let accepted = std::iter::from_fn(|| listener.accept().ok()).count();
        assert_eq!(accepted, PEERS, "every connection waited in the backlog");
        drop(peers);
    }
}
