//! The TCP segment descriptor: what an engine tells peers about itself in
//! reply to a Metadata request, and how we read a peer's.

use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

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
}

/// Build our own descriptor JSON (one line, no trailing newline).
///
/// `buffers` may be cut short by the caller to keep the frame under the
/// handshake limit; the list is optional for peers.
pub fn encode_descriptor(name: &str, data_host: &str, data_port: u16, buffers: &[AdvertisedBuffer]) -> String {
    let buffers: Vec<Value> =
        buffers.iter().map(|b| json!({"addr": b.addr, "length": b.length, "name": name})).collect();
    json!({
        "buffers": buffers,
        "name": name,
        "protocol": "tcp",
        "rdma_server_name": "",
        "tcp_data_host": data_host,
        "tcp_data_port": data_port,
        "tcp_proto_version": 2,
    })
    .to_string()
}

fn corrupted(why: &str) -> Error {
    Error::protocol(format!("corrupted segment descriptor: {why}"))
}

/// Parse a peer's descriptor. `session_host` is the host of the session name
/// we dialled, used when the descriptor names no data host.
pub fn parse_descriptor(text: &[u8], session_name: &str, session_host: &str) -> Result<PeerDescriptor> {
    let value: Value = serde_json::from_slice(text).map_err(|e| corrupted(&format!("not JSON ({e})")))?;
    let obj: &Map<String, Value> = value.as_object().ok_or_else(|| corrupted("not a JSON object"))?;
    match obj.get("protocol").and_then(Value::as_str) {
        Some("tcp") => {}
        Some(other) => {
            return Err(Error::new(
                crate::ErrorKind::Protocol,
                format!("peer {session_name} publishes a '{other}' segment; the native engine speaks tcp only"),
            ))
        }
        None => return Err(corrupted("no \"protocol\" field")),
    }
    let data_port = obj
        .get("tcp_data_port")
        .and_then(Value::as_u64)
        .filter(|p| (1..=u64::from(u16::MAX)).contains(p))
        .ok_or_else(|| corrupted("\"tcp_data_port\" missing or not a port number"))? as u16;
    let proto_version = match obj.get("tcp_proto_version") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or_else(|| corrupted("\"tcp_proto_version\" is not an unsigned integer"))?,
    };
    let data_host = match obj.get("tcp_data_host").and_then(Value::as_str) {
        Some(h) if !h.is_empty() => h.to_owned(),
        _ => session_host.to_owned(),
    };
    let notify_name = match obj.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_owned(),
        _ => session_name.to_owned(),
    };
    let mut buffers = Vec::new();
    if let Some(list) = obj.get("buffers") {
        let list = list.as_array().ok_or_else(|| corrupted("\"buffers\" is not an array"))?;
        for entry in list {
            let name_ok = entry.get("name").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
            let addr = entry.get("addr").and_then(Value::as_u64).filter(|&a| a != 0);
            let length = entry.get("length").and_then(Value::as_u64).filter(|&l| l != 0);
            match (name_ok, addr, length) {
                (true, Some(addr), Some(length)) => buffers.push(AdvertisedBuffer { addr, length }),
                _ => return Err(corrupted("a \"buffers\" entry lacks a name, a non-zero addr or a non-zero length")),
            }
        }
    }
    Ok(PeerDescriptor { data_host, data_port, proto_version, notify_name, buffers })
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
    fn our_descriptor_round_trips_and_is_sorted() {
        let text = encode_descriptor("h:1", "h", 2, &[AdvertisedBuffer { addr: 4096, length: 10 }]);
        assert!(
            text.starts_with(r#"{"buffers":[{"addr":4096,"length":10,"name":"h:1"}],"name":"h:1","protocol":"tcp""#)
        );
        let d = parse_descriptor(text.as_bytes(), "x:9", "x").unwrap();
        assert_eq!((d.data_host.as_str(), d.data_port, d.proto_version), ("h", 2, 2));
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
            br#"[1]"#,
            b"\xff{",
        ] {
            assert!(parse_descriptor(bad, "a:1", "a").is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
