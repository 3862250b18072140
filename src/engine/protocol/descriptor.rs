//! The TCP segment descriptor: what an engine tells peers about itself in
//! reply to a Metadata request, and how we read a peer's.

use serde::{Deserialize, Serialize};

use super::super::net::rails::LocalRail;
use crate::error::{Error, Result};

/// The target this module logs under: its path before the engine's files
/// were grouped by role, kept so that `RUST_LOG` filters and log callbacks
/// see the module names they always saw.
const LOG_TARGET: &str = "pdx::engine::descriptor";

/// One registered region as advertised in a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdvertisedBuffer {
    pub addr: u64,
    pub length: u64,
}

/// What we need from a peer's descriptor to move data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerDescriptor {
    /// Host for data connections (`tcp_data_host`, else the session host).
    pub data_host: String,
    pub data_port: u16,
    /// `tcp_proto_version`; 0 when absent.
    pub proto_version: u64,
    /// `name` (`host:rpc_port`), where notifications go; the session name
    /// when absent.
    pub notify_name: String,
    pub buffers: Vec<AdvertisedBuffer>,
    /// `pdx_instance`: the engine instance of a pdx peer, which its data
    /// port confirms (see [`super::hello`]); `None` for a Mooncake peer.
    pub instance: Option<String>,
    /// `pdx_host`: where a pdx peer runs, as the same-host link reads it
    /// (this layer carries it without interpreting it).
    pub(crate) host: Option<serde_json::Value>,
    /// `pdx_rails`: the addresses a pdx peer with `PDX_TCP_RAILS` takes
    /// data on, at `data_port` (see [`super::super::net::rails`]); empty otherwise.
    pub rails: Vec<std::net::IpAddr>,
}

/// Our descriptor as it goes on the wire: fields in Mooncake's (sorted) order.
#[derive(Serialize)]
struct OwnDescriptor<'a> {
    buffers: Vec<OwnBuffer<'a>>,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pdx_host: Option<&'a serde_json::Value>,
    pdx_instance: &'a str,
    /// Absent without rails, so that the descriptor is what it was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pdx_rails: Vec<String>,
    protocol: &'static str,
    rdma_server_name: &'static str,
    tcp_data_host: &'a str,
    tcp_data_port: u16,
    tcp_proto_version: u32,
}

#[derive(Serialize)]
struct OwnBuffer<'a> {
    addr: u64,
    length: u64,
    name: &'a str,
}

/// A peer's descriptor as read: every field optional here, checked below
/// with Mooncake's rules; unknown fields are ignored.
#[derive(Deserialize)]
struct PeerFields {
    protocol: Option<String>,
    tcp_data_port: Option<u64>,
    tcp_proto_version: Option<u64>,
    tcp_data_host: Option<String>,
    name: Option<String>,
    pdx_instance: Option<String>,
    /// Read leniently: a malformed identity only means no same-host link.
    pdx_host: Option<serde_json::Value>,
    /// Read leniently: a malformed list only means fewer rails.
    pdx_rails: Option<serde_json::Value>,
    buffers: Option<Vec<PeerBuffer>>,
}

#[derive(Deserialize)]
struct PeerBuffer {
    name: Option<String>,
    addr: Option<u64>,
    length: Option<u64>,
}

/// Build our own descriptor JSON (one line, no trailing newline).
///
/// `buffers` may be cut short by the caller to keep the frame under the
/// handshake limit; the list is optional for peers.
/// `instance` is this engine's (see [`super::hello`]); a Mooncake peer ignores
/// the field.
#[cfg(any(test, feature = "fuzzing"))]
pub fn encode_descriptor(
    name: &str,
    instance: &str,
    data_host: &str,
    data_port: u16,
    buffers: &[AdvertisedBuffer],
) -> String {
    encode_with_host(name, instance, data_host, data_port, buffers, None, &[])
}

/// [`encode_descriptor`] with the engine's host identity.
fn encode_with_host(
    name: &str,
    instance: &str,
    data_host: &str,
    data_port: u16,
    buffers: &[AdvertisedBuffer],
    host: Option<&serde_json::Value>,
    rails: &[std::net::IpAddr],
) -> String {
    let own = OwnDescriptor {
        pdx_host: host,
        pdx_rails: rails.iter().map(ToString::to_string).collect(),
        buffers: buffers.iter().map(|b| OwnBuffer { addr: b.addr, length: b.length, name }).collect(),
        name,
        pdx_instance: instance,
        protocol: "tcp",
        rdma_server_name: "",
        tcp_data_host: data_host,
        tcp_data_port: data_port,
        tcp_proto_version: 2,
    };
    // Serializing plain strings and integers cannot fail.
    serde_json::to_string(&own).unwrap_or_default()
}

fn corrupted(why: &str) -> Error {
    Error::protocol(format!("corrupted segment descriptor: {why}"))
}

/// Parse a peer's descriptor. `session_host` is the host of the session name
/// we dialled, used when the descriptor names no data host.
pub fn parse_descriptor(text: &[u8], session_name: &str, session_host: &str) -> Result<PeerDescriptor> {
    let d: PeerFields = serde_json::from_slice(text).map_err(|e| corrupted(&e.to_string()))?;
    match d.protocol.as_deref() {
        Some("tcp") => {}
        Some(other) => {
            return Err(Error::new(
                crate::ErrorKind::Protocol,
                format!("peer {session_name} publishes a '{other}' segment; the native engine speaks tcp only"),
            ))
        }
        None => return Err(corrupted("no \"protocol\" field")),
    }
    let data_port = d
        .tcp_data_port
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| corrupted("\"tcp_data_port\" missing or not a port number"))?;
    let non_empty =
        |v: Option<String>, fallback: &str| v.filter(|s| !s.is_empty()).unwrap_or_else(|| fallback.to_owned());
    let buffers = d
        .buffers
        .unwrap_or_default()
        .into_iter()
        .map(|b| {
            match (b.name.is_some_and(|n| !n.is_empty()), b.addr.filter(|&a| a != 0), b.length.filter(|&l| l != 0)) {
                (true, Some(addr), Some(length)) => Ok(AdvertisedBuffer { addr, length }),
                _ => Err(corrupted("a \"buffers\" entry lacks a name, a non-zero addr or a non-zero length")),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    // A host from a store or a peer reaches log lines and errors: no
    // control characters or spaces, no longer than a DNS name.
    if let Some(h) = &d.tcp_data_host {
        if h.len() > 255 || h.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(corrupted("\"tcp_data_host\" is not a host name"));
        }
    }
    let instance = match d.pdx_instance {
        Some(i) if !i.is_empty() && i.len() <= 64 && i.bytes().all(|b| b.is_ascii_hexdigit()) => Some(i),
        Some(_) => return Err(corrupted("\"pdx_instance\" is not 1 to 64 hex digits")),
        None => None,
    };
    Ok(PeerDescriptor {
        data_host: non_empty(d.tcp_data_host, session_host),
        data_port,
        proto_version: d.tcp_proto_version.unwrap_or(0),
        notify_name: non_empty(d.name, session_name),
        buffers,
        instance,
        host: d.pdx_host,
        rails: super::super::net::rails::parse_advertised(d.pdx_rails.as_ref()),
    })
}

/// Who we are on the network.
#[derive(Clone)]
pub(crate) struct Identity {
    pub session_id: String,
    pub data_host: String,
    pub rpc_port: u16,
    pub data_port: u16,
    /// This engine's instance id, advertised in the descriptor and
    /// confirmed on every data connection (see [`super::hello`]).
    pub instance: String,
    /// The local rails data connections may take (`PDX_TCP_RAILS`; empty:
    /// one address), advertised in the descriptor (see [`super::super::net::rails`]).
    pub rails: Vec<LocalRail>,
}

/// Our descriptor (`identity`, where this process runs as `host` says,
/// and `buffers` cut short if they would not fit one frame of `max_frame`
/// bytes).
pub(crate) fn own(
    identity: &Identity,
    host: Option<&serde_json::Value>,
    mut buffers: Vec<AdvertisedBuffer>,
    max_frame: usize,
) -> String {
    loop {
        let id = identity;
        let rails: Vec<std::net::IpAddr> = id.rails.iter().map(|r| r.addr).collect();
        let text = encode_with_host(&id.session_id, &id.instance, &id.data_host, id.data_port, &buffers, host, &rails);
        if text.len() + 2 <= max_frame || buffers.is_empty() {
            return text;
        }
        log::warn!(target: LOG_TARGET, "descriptor too large for one handshake frame; advertising fewer buffers");
        buffers.truncate(buffers.len() / 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPTURED: &str = r#"{"buffers":[{"addr":139730510393360,"length":1048576,"name":"127.0.0.1:16559"}],"name":"127.0.0.1:16559","protocol":"tcp","rdma_server_name":"","tcp_data_host":"127.0.0.1","tcp_data_port":15907,"tcp_proto_version":2,"timestamp":"2026-11-29 07:51:44.196787"}"#;

    #[test]
    fn parses_a_captured_descriptor() {
        let d = parse_descriptor(CAPTURED.as_bytes(), "127.0.0.1:16559", "127.0.0.1").unwrap();
        assert_eq!(d.data_port, 15907);
        assert_eq!(d.proto_version, 2);
        assert_eq!(d.data_host, "127.0.0.1");
        assert_eq!(d.notify_name, "127.0.0.1:16559");
        assert_eq!(d.buffers, vec![AdvertisedBuffer { addr: 139730510393360, length: 1048576 }]);
    }

    #[test]
    fn a_data_host_with_control_characters_is_refused() {
        let split = CAPTURED.replace(r#""tcp_data_host":"127.0.0.1""#, r#""tcp_data_host":"127.0.0.1\r\nX""#);
        let e = parse_descriptor(split.as_bytes(), "a:1", "a").err().unwrap();
        assert!(e.message().contains("tcp_data_host"), "{e}");
    }

    #[test]
    fn our_descriptor_round_trips_and_is_sorted() {
        let text = encode_descriptor("h:1", "0a1b", "h", 2, &[AdvertisedBuffer { addr: 4096, length: 10 }]);
        assert!(text.starts_with(
            r#"{"buffers":[{"addr":4096,"length":10,"name":"h:1"}],"name":"h:1","pdx_instance":"0a1b","protocol":"tcp""#
        ));
        let d = parse_descriptor(text.as_bytes(), "x:9", "x").unwrap();
        assert_eq!((d.data_host.as_str(), d.data_port, d.proto_version), ("h", 2, 2));
        assert_eq!(d.instance.as_deref(), Some("0a1b"));
        // Mooncake's descriptor has no instance.
        assert_eq!(parse_descriptor(CAPTURED.as_bytes(), "a:1", "a").unwrap().instance, None);
    }

    #[test]
    fn rails_are_advertised_only_when_there_are_some() {
        let b = [AdvertisedBuffer { addr: 4096, length: 10 }];
        let without = encode_with_host("h:1", "0a1b", "h", 2, &b, None, &[]);
        assert_eq!(without, encode_descriptor("h:1", "0a1b", "h", 2, &b));
        assert!(!without.contains("pdx_rails"), "no rails: the descriptor is byte for byte what it was");
        let rails = ["10.231.1.1".parse().unwrap(), "10.231.2.1".parse().unwrap()];
        let with = encode_with_host("h:1", "0a1b", "h", 2, &b, None, &rails);
        assert!(
            with.contains(r#""pdx_instance":"0a1b","pdx_rails":["10.231.1.1","10.231.2.1"],"protocol":"tcp""#),
            "{with}"
        );
        assert_eq!(parse_descriptor(with.as_bytes(), "x:9", "x").unwrap().rails, rails.to_vec());
        assert!(parse_descriptor(CAPTURED.as_bytes(), "a:1", "a").unwrap().rails.is_empty(), "Mooncake: none");
        let odd = br#"{"protocol":"tcp","tcp_data_port":7,"pdx_rails":"10.0.0.1"}"#;
        assert!(parse_descriptor(odd, "a:1", "a").unwrap().rails.is_empty(), "a malformed list is no rails, no error");
    }

    #[test]
    fn optional_fields_fall_back_and_bad_ones_are_refused() {
        let d = parse_descriptor(br#"{"protocol":"tcp","tcp_data_port":7}"#, "a:1", "a").unwrap();
        assert_eq!((d.data_host.as_str(), d.proto_version, d.notify_name.as_str()), ("a", 0, "a:1"));
        for bad in [
            &br#"{"tcp_data_port":7}"#[..],
            br#"{"protocol":"rdma","tcp_data_port":7}"#,
            br#"{"protocol":"tcp"}"#,
            br#"{"protocol":"tcp","tcp_data_port":70000}"#,
            br#"{"protocol":"tcp","tcp_data_port":7,"buffers":[{"addr":"1","length":1,"name":"n"}]}"#,
            br#"{"protocol":"tcp","tcp_data_port":7,"buffers":[{"addr":0,"length":1,"name":"n"}]}"#,
            br#"{"protocol":"tcp","tcp_data_port":7,"tcp_proto_version":-1}"#,
            br#"{"protocol":"tcp","tcp_data_port":7,"pdx_instance":"not hex"}"#,
            br#"{"protocol":"tcp","tcp_data_port":7,"pdx_instance":""}"#,
            br#"[1]"#,
            b"\xff{",
        ] {
            assert!(parse_descriptor(bad, "a:1", "a").is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
