//! The engine's two listening sockets: bound at a random port of a range, as
//! Mooncake picks its ports, and woken when the engine stops.

use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener};

use crate::error::{Error, Result};

/// Bind a listener on `ip` at a random port in `[min, max]`, as Mooncake
/// picks ports (up to 500 tries).
pub fn bind_in_range(ip: IpAddr, min: u16, max: u16) -> Result<TcpListener> {
    let mut last_err = None;
    for _ in 0..500 {
        let port = fastrand::u16(min..=max);
        match TcpListener::bind(SocketAddr::new(ip, port)) {
            Ok(l) => return Ok(l),
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
