//! Network address helpers: session ids (`host:port`, IPv6 bracketed) and
//! free-port discovery, as SGLang's `NetworkAddress` / `get_free_port` do it.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use crate::error::{Error, Result};

/// Remove one pair of surrounding brackets: `"[::1]"` → `"::1"`.
pub fn strip_brackets(host: &str) -> &str {
    if host.len() >= 2 && host.starts_with('[') && host.ends_with(']') {
        &host[1..host.len() - 1]
    } else {
        host
    }
}

/// Whether `host` (without brackets) is an IPv6 literal, as Python's
/// `ipaddress.IPv6Address` decides it: a scope suffix such as `%eth0` is
/// allowed after the address.
pub fn is_ipv6(host: &str) -> bool {
    let (addr, scope) = match host.split_once('%') {
        Some((a, s)) => (a, Some(s)),
        None => (host, None),
    };
    if matches!(scope, Some(s) if s.is_empty() || s.contains('%') || s.contains('/')) {
        return false;
    }
    addr.parse::<Ipv6Addr>().is_ok()
}

/// `host` ready to be followed by `:port`: IPv6 literals are bracketed,
/// IPv4 addresses and host names are returned unchanged. Input brackets are
/// stripped first, so `"[::1]"` and `"::1"` give the same result.
pub fn wrap_host(host: &str) -> String {
    let bare = strip_brackets(host);
    if is_ipv6(bare) {
        format!("[{bare}]")
    } else {
        bare.to_owned()
    }
}

/// The Mooncake session id of an engine listening on `port` at `host`:
/// `"host:port"`, or `"[v6]:port"` for an IPv6 literal.
///
/// ```
/// use pdx::config::net::session_id;
/// assert_eq!(session_id("10.0.0.1", 17000), "10.0.0.1:17000");
/// assert_eq!(session_id("::1", 17000), "[::1]:17000");
/// assert_eq!(session_id("[::1]", 17000), "[::1]:17000");
/// ```
pub fn session_id(host: &str, port: u16) -> String {
    format!("{}:{port}", wrap_host(host))
}

/// A TCP port that was free a moment ago: bind port 0 on the IPv4 wildcard
/// (IPv6 wildcard as fallback), read the port, close the socket.
///
/// Racy by nature, exactly like SGLang's `get_free_port()`: another process
/// may take the port before it is used.
pub fn free_port() -> Result<u16> {
    let candidates = [SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)), SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0))];
    for addr in candidates {
        if let Ok(listener) = TcpListener::bind(addr) {
            if let Ok(local) = listener.local_addr() {
                return Ok(local.port());
            }
        }
    }
    Err(Error::io("Could not bind port 0 on any configured address family"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids() {
        assert_eq!(session_id("127.0.0.1", 1), "127.0.0.1:1");
        assert_eq!(session_id("node-3.example", 65535), "node-3.example:65535");
        assert_eq!(session_id("::1", 12345), "[::1]:12345");
        assert_eq!(session_id("[::1]", 12345), "[::1]:12345");
        assert_eq!(session_id("fe80::1%eth0", 5), "[fe80::1%eth0]:5");
        assert_eq!(session_id("2001:db8::8:800:200c:417a", 80), "[2001:db8::8:800:200c:417a]:80");
        // Not an IPv6 literal: left alone (brackets of a non-address too are
        // stripped, as SGLang strips any surrounding pair).
        assert_eq!(session_id("[host]", 1), "host:1");
        assert_eq!(session_id("::g", 1), "::g:1");
        assert_eq!(session_id("", 1), ":1");
    }

    #[test]
    fn ipv6_detection() {
        assert!(is_ipv6("::"));
        assert!(is_ipv6("::ffff:1.2.3.4"));
        assert!(!is_ipv6("1.2.3.4"));
        assert!(!is_ipv6("fe80::1%"));
        assert!(!is_ipv6("[::1]"));
    }

    #[test]
    fn free_port_is_bindable_now() {
        let port = free_port().unwrap();
        assert_ne!(port, 0);
    }
}
