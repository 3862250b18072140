//! The body of a notification frame (type 2 on the handshake port),
//! `{"name":"...","notify_msg":"..."}`, with the name and the message as
//! bytes. Pure functions over bytes: no I/O, no panics.
//!
//! Mooncake's reader takes the bytes of a JSON string as they come (checked
//! against the 0.3.13 wheel: every byte 0x80-0xff arrives unchanged in its
//! queue, `\u0000` arrives as a NUL), so pdx writes each string's bytes as
//! they are, escaping only what JSON must (`"`, `\` and the control bytes
//! below 0x20): a name or message that is UTF-8 is plain JSON text, and
//! one that is not reaches a pdx or a Mooncake peer intact. pdx reads the
//! strings as bytes too (escapes decoded, lone surrogates kept as their
//! three bytes, as Mooncake's reader keeps them). What Mooncake's *writer*
//! does to bytes that are not UTF-8 is in docs/wire.md: it re-encodes
//! them, and nothing on the receiving side can undo that.

use serde::de::{Deserializer, Error as _, Visitor};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::transfer::Notification;

/// The bytes of `s` inside a JSON string: `"` and `\` escaped, control
/// bytes as `\b`, `\t`, `\n`, `\f`, `\r` or `\u00XX`, every other byte as
/// it is.
fn push_string(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    for &b in s {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\r' => out.extend_from_slice(b"\\r"),
            0..0x20 => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

/// Bytes [`push_string`] writes for `s`.
fn string_len(s: &[u8]) -> usize {
    let escapes: usize = s
        .iter()
        .map(|&b| match b {
            b'"' | b'\\' | 0x08 | b'\t' | b'\n' | 0x0c | b'\r' => 1,
            0..0x20 => 5,
            _ => 0,
        })
        .sum();
    s.len() + escapes + 2
}

const NAME_KEY: &[u8] = b"{\"name\":";
const MSG_KEY: &[u8] = b",\"notify_msg\":";

/// The request body for `note`.
pub fn encode(note: &Notification) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(note));
    out.extend_from_slice(NAME_KEY);
    push_string(&mut out, &note.name);
    out.extend_from_slice(MSG_KEY);
    push_string(&mut out, &note.msg);
    out.push(b'}');
    out
}

/// `encode(note).len()`, computed without building it.
pub fn encoded_len(note: &Notification) -> usize {
    NAME_KEY.len() + string_len(&note.name) + MSG_KEY.len() + string_len(&note.msg) + 1
}

/// The handshake frame `note` travels in, in bytes: its length prefix
/// counts the type byte, the body and the newline after it.
pub fn frame_len(note: &Notification) -> usize {
    encoded_len(note) + 2
}

/// Refuse `note` when its frame is over `limit`, the handshake frame limit
/// this engine assumes its peers enforce (its own): a peer closes a longer
/// frame unread, and the sender would see only a reset connection.
pub fn check_frame(note: &Notification, limit: usize) -> Result<()> {
    let frame = frame_len(note);
    if frame <= limit {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "a notification of {} bytes (name and message; a handshake frame of {frame} bytes) is over the peer's \
         handshake frame limit of {limit} bytes: a peer closes a longer frame unread (Mooncake's \
         MC_HANDSHAKE_MAX_LENGTH, 1 MiB by default; pdx assumes its own, the engine option handshake_max_length \
         or MC_HANDSHAKE_MAX_LENGTH). Raise it on both sides, or send less",
        note.len()
    )))
}

/// A JSON string as its bytes (escapes decoded, nothing validated as UTF-8).
struct Bytes(Vec<u8>);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Bytes, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> std::result::Result<Bytes, E> {
                Ok(Bytes(v.to_vec()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Bytes, E> {
                Ok(Bytes(v.as_bytes().to_vec()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> std::result::Result<Bytes, A::Error> {
                Err(A::Error::custom("an array is not a string"))
            }
        }
        d.deserialize_bytes(V)
    }
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    name: Option<Bytes>,
    #[serde(default)]
    notify_msg: Option<Bytes>,
}

/// What a notification request says.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A name and a message: queue them.
    Note(Notification),
    /// JSON, but without a string name and message: answer "rejected".
    Refused,
    /// Not JSON: close without an answer, as for any malformed frame.
    Malformed,
}

/// Decode a request body (its length is the frame's, already bounded).
pub fn decode(json: &[u8]) -> Decoded {
    match serde_json::from_slice::<Body>(json) {
        Ok(Body { name: Some(name), notify_msg: Some(msg) }) => Decoded::Note(Notification::new(name.0, msg.0)),
        Ok(_) => Decoded::Refused,
        // Fields of another type (a number, an object) fail the byte
        // reader above; well-formed JSON still gets its answer.
        Err(_) if serde_json::from_slice::<serde::de::IgnoredAny>(json).is_ok() => Decoded::Refused,
        Err(_) => Decoded::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(name: &[u8], msg: &[u8]) {
        let note = Notification::new(name, msg);
        let body = encode(&note);
        assert_eq!(body.len(), encoded_len(&note));
        assert_eq!(decode(&body), Decoded::Note(note), "{}", String::from_utf8_lossy(&body));
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255u8).collect();
        round_trip(&all, &all);
        round_trip(b"", b"");
        round_trip(b"PUSH_REG:", b"PUSH_REG:\x82\xa4name\xa1A\x00\x8b\xff");
        round_trip("é€😀".as_bytes(), b"\"\\\n\x7f");
    }

    #[test]
    fn text_is_plain_json_and_other_bytes_go_raw() {
        let body = encode(&Notification::new("kv", "a\"b\\c\n\x01é"));
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, serde_json::json!({"name": "kv", "notify_msg": "a\"b\\c\n\u{1}é"}));
        assert_eq!(encode(&Notification::new("n", b"\x8b\x00")), b"{\"name\":\"n\",\"notify_msg\":\"\x8b\\u0000\"}");
    }

    #[test]
    fn what_mooncake_writes_is_read() {
        // The wheel's frame for the message `PUSH_REG:` 0x8b 0xa1 'A' 0x92 0x01
        // and the name `nm` 0xff (its JSON writer re-encodes the bytes that
        // are not UTF-8, escaping everything above 0x7f).
        let wheel = br#"{"name":"nm\ufffd","notify_msg":"PUSH_REG:\u02e1A\u0481"}"#;
        assert_eq!(decode(wheel), Decoded::Note(Notification::new(b"nm\xef\xbf\xbd", b"PUSH_REG:\xcb\xa1A\xd2\x81")));
        // A lone surrogate (the wheel writes one for 0xf5 0x80 0x80 0x80)
        // is kept as its three bytes, as Mooncake's reader keeps it.
        let lone = br#"{"name":"n","notify_msg":"\u17c0\udc00|"}"#;
        assert_eq!(decode(lone), Decoded::Note(Notification::new("n", b"\xe1\x9f\x80\xed\xb0\x80|")));
        let nul = br#"{"notify_msg":"a\u0000b","name":"n","other":[1,{"x":"\u0000"}]}"#;
        assert_eq!(decode(nul), Decoded::Note(Notification::new("n", b"a\x00b")));
    }

    #[test]
    fn frames_over_the_limit_are_refused_before_sending() {
        let limit = 1 << 20;
        let fits = Notification::new("n", vec![b'x'; limit - frame_len(&Notification::new("n", ""))]);
        assert_eq!(frame_len(&fits), limit);
        check_frame(&fits, limit).unwrap();
        // One more byte, or one that needs escaping, and it does not fit.
        let mut over = fits.clone();
        over.msg[0] = b'"';
        let e = check_frame(&over, limit).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(e.message().contains("handshake frame limit of 1048576 bytes"), "{e}");
        assert!(e.message().contains("MC_HANDSHAKE_MAX_LENGTH") && e.message().contains("handshake_max_length"), "{e}");
        let e = check_frame(&Notification::new("n", vec![0u8; 8 << 20]), limit).unwrap_err();
        assert!(e.message().starts_with("a notification of 8388609 bytes"), "{e}");
    }

    #[test]
    fn anything_else_is_refused_or_malformed() {
        assert_eq!(decode(br#"{"name":"n"}"#), Decoded::Refused);
        assert_eq!(decode(br#"{"name":1,"notify_msg":"m"}"#), Decoded::Refused);
        assert_eq!(decode(br#"{"name":["n"],"notify_msg":"m"}"#), Decoded::Refused);
        assert_eq!(decode(br#"[]"#), Decoded::Refused);
        // Raw control bytes are not JSON, but Mooncake's reader takes them; so does pdx's.
        let raw = b"{\"name\":\"n\",\"notify_msg\":\"raw\x01\x00\"}";
        assert_eq!(decode(raw), Decoded::Note(Notification::new("n", b"raw\x01\x00")));
        assert_eq!(decode(br#"{"name":"n","notify_msg":"m""#), Decoded::Malformed);
        assert_eq!(decode(b""), Decoded::Malformed);
        assert_eq!(decode(br#"{"name":"n","notify_msg":"\x"}"#), Decoded::Malformed);
    }
}
