//! A notification: the name and the message one engine sends another with
//! (or after) a transfer, both bytes. Callers send what they like
//! (vLLM's push connector sends `PUSH_REG:` and msgpack), so every layer
//! hands them on as bytes; only the wire decides what a peer can receive
//! intact (the native engine's `protocol::notify` says what Mooncake's
//! wire does to them).

/// Most bytes a notification's name and message may have together when a
/// caller hands them to pdx: the largest handshake frame Mooncake allows
/// (`MC_HANDSHAKE_MAX_LENGTH` at most 128 MiB). A backend's own limit, the
/// frame limit in force, is smaller and checked before anything is sent.
pub(crate) const MAX_NOTIFICATION_BYTES: usize = 128 << 20;

/// A notification's name and message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Notification {
    pub name: Vec<u8>,
    pub msg: Vec<u8>,
}

impl Notification {
    pub fn new(name: impl Into<Vec<u8>>, msg: impl Into<Vec<u8>>) -> Notification {
        Notification { name: name.into(), msg: msg.into() }
    }

    /// Bytes of the name and the message together.
    pub fn len(&self) -> usize {
        self.name.len().saturating_add(self.msg.len())
    }

    pub fn is_empty(&self) -> bool {
        self.name.is_empty() && self.msg.is_empty()
    }

    /// Refuse a name and message over [`MAX_NOTIFICATION_BYTES`] together.
    pub fn check_size(name_len: usize, msg_len: usize) -> crate::error::Result<()> {
        let total = name_len.saturating_add(msg_len);
        if total > MAX_NOTIFICATION_BYTES {
            return Err(crate::error::Error::invalid_argument(format!(
                "a notification of {total} bytes (name and message) is over pdx's limit of {MAX_NOTIFICATION_BYTES} \
                 (the largest handshake frame Mooncake's wire allows)"
            )));
        }
        Ok(())
    }
}

/// `bytes` for a log line or an error text: quoted, UTF-8 shown as it is,
/// other bytes as `\xNN`, at most 64 bytes of it (then the length).
pub fn shown(bytes: &[u8]) -> String {
    const SHOWN: usize = 64;
    let head = &bytes[..bytes.len().min(SHOWN)];
    let mut out = String::with_capacity(head.len() + 8);
    out.push('"');
    for chunk in head.utf8_chunks() {
        for c in chunk.valid().chars() {
            out.extend(c.escape_debug());
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out.push('"');
    if bytes.len() > SHOWN {
        out.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_keeps_text_and_escapes_the_rest() {
        assert_eq!(shown(b"room 7"), r#""room 7""#);
        assert_eq!(shown(b"PUSH_REG:\x8b\xa1A\x00"), r#""PUSH_REG:\x8b\xa1A\0""#);
        assert_eq!(shown("é\"".as_bytes()), r#""é\"""#);
        let long = shown(&[b'x'; 100]);
        assert!(long.starts_with(&format!("\"{}\"", "x".repeat(64))) && long.ends_with("... (100 bytes)"), "{long}");
    }

    #[test]
    fn sizes_are_bounded() {
        assert!(Notification::check_size(MAX_NOTIFICATION_BYTES, 0).is_ok());
        let e = Notification::check_size(MAX_NOTIFICATION_BYTES, 1).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(Notification::check_size(usize::MAX, usize::MAX).is_err());
        let n = Notification::new("a", vec![0u8, 0xff]);
        assert_eq!((n.len(), n.is_empty()), (3, false));
        assert!(Notification::default().is_empty());
    }
}
