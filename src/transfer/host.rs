//! Engine hostnames and peer session names: the one place pdx splits
//! `host:port` text. Bracket and IPv6 rules are SGLang's
//! ([`crate::config::net`]).

use crate::config::net::is_ipv6;
use crate::error::{Error, Result};

/// The host an engine named `hostname` runs on: `h`, `h:port`,
/// `h:port:npu_N` (Ascend), `[v6]`, `[v6]:port` or a bare IPv6 literal give
/// the bare host (no brackets). A port in the name is ignored, as Mooncake
/// ignores it in P2P mode.
pub fn engine_host(hostname: &str) -> Result<String> {
    let h = hostname.trim();
    let bad = |why: &str| Error::invalid_argument(format!("invalid hostname {hostname:?}: {why}"));
    if h.is_empty() {
        return Err(Error::invalid_argument("hostname is empty"));
    }
    let host = if let Some(rest) = h.strip_prefix('[') {
        rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?.0
    } else if is_ipv6(h) {
        h
    } else {
        h.split(':').next().unwrap_or(h)
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    Ok(host.to_owned())
}

/// A peer's session name split into its handshake endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionAddr {
    pub host: String,
    pub port: u16,
}

/// Parse `host:port`, `[v6]:port`, or a bare host (port = `default_port`).
/// Leading `/` are ignored, as Mooncake does.
pub fn parse_session(name: &str, default_port: u16) -> Result<SessionAddr> {
    let bad = |why: &str| Error::invalid_argument(format!("invalid session name {name:?}: {why}"));
    let s = name.trim_start_matches('/');
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        match after.strip_prefix(':') {
            _ if after.is_empty() => (host, None),
            Some(p) => (host, Some(p)),
            None => return Err(bad("unexpected text after ']'")),
        }
    } else {
        match s.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    let port = match port {
        None => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| bad("port is not 1..65535"))?,
    };
    Ok(SessionAddr { host: host.to_owned(), port })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_hosts_drop_ports_and_npu_suffixes() {
        for (name, host) in [
            ("10.0.0.1", "10.0.0.1"),
            (" 10.0.0.1:17000:npu_3 ", "10.0.0.1"),
            ("node7:1234", "node7"),
            ("[::1]:5", "::1"),
            ("[::1]", "::1"),
            ("fe80::1", "fe80::1"),
            ("fe80::1%eth0", "fe80::1%eth0"),
            ("localhost", "localhost"),
        ] {
            assert_eq!(engine_host(name).unwrap(), host, "{name}");
        }
        for bad in ["", "  ", ":80", "[::1", "[]:1"] {
            assert!(engine_host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn session_names() {
        let p = |s| parse_session(s, 12001);
        assert_eq!(p("127.0.0.1:16559").unwrap(), SessionAddr { host: "127.0.0.1".into(), port: 16559 });
        assert_eq!(p("//h:1").unwrap(), SessionAddr { host: "h".into(), port: 1 });
        assert_eq!(p("[::1]:80").unwrap(), SessionAddr { host: "::1".into(), port: 80 });
        assert_eq!(p("[::1]").unwrap(), SessionAddr { host: "::1".into(), port: 12001 });
        assert_eq!(p("localhost").unwrap(), SessionAddr { host: "localhost".into(), port: 12001 });
        for bad in ["", "/", ":80", "h:0", "h:x", "h:70000", "[::1", "[::1]x", "[]:1"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }
}
