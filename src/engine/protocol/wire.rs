//! Codecs for Mooncake's TCP transport (P2PHANDSHAKE mode): the handshake
//! frame on the RPC port and the 24-byte request header plus the 8-byte
//! status frame on the data port. Pure functions over bytes: no I/O, no
//! panics, every length bounded by the caller's limit.

use crate::transfer::Direction;

/// Handshake frame types (the byte after the length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// RDMA-style connection setup; a TCP-only engine answers with an empty
    /// handshake description.
    Connection,
    /// Segment descriptor exchange.
    Metadata,
    /// A notification (name, message).
    Notify,
    /// Liveness probe.
    Probe,
    /// The untyped old protocol: the body is JSON with no type byte, handled
    /// like `Connection`, and answered without a type byte.
    Old,
}

impl FrameType {
    /// The byte sent on the wire, or `None` for the untyped old protocol.
    pub fn byte(self) -> Option<u8> {
        match self {
            FrameType::Connection => Some(0),
            FrameType::Metadata => Some(1),
            FrameType::Notify => Some(2),
            FrameType::Probe => Some(3),
            FrameType::Old => None,
        }
    }
}

/// Smallest handshake frame limit Mooncake accepts (the default; the
/// largest allowed is declared with `MC_HANDSHAKE_MAX_LENGTH`).
pub(crate) const HANDSHAKE_MIN_LIMIT: usize = 1 << 20;

/// Why a handshake length prefix is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameLengthError {
    Empty,
    TooLong { length: u64, limit: usize },
}

/// Validate the 8-byte little-endian length prefix of a handshake frame.
pub fn check_frame_length(prefix: [u8; 8], limit: usize) -> Result<usize, FrameLengthError> {
    let length = u64::from_le_bytes(prefix);
    if length == 0 {
        return Err(FrameLengthError::Empty);
    }
    if length > limit as u64 {
        return Err(FrameLengthError::TooLong { length, limit });
    }
    Ok(length as usize)
}

/// Split a frame body (the `length` bytes after the prefix) into its type and
/// JSON text. A first byte above 3 means the old, untyped protocol (JSON
/// always starts with `{`, so the two cannot be confused).
pub fn split_frame_body(body: &[u8]) -> (FrameType, &[u8]) {
    match body.first() {
        Some(0) => (FrameType::Connection, &body[1..]),
        Some(1) => (FrameType::Metadata, &body[1..]),
        Some(2) => (FrameType::Notify, &body[1..]),
        Some(3) => (FrameType::Probe, &body[1..]),
        _ => (FrameType::Old, body),
    }
}

/// Encode a frame: `[len u64 LE][type][json]`, with the trailing newline
/// Mooncake's writer adds. `json` is bytes: a notification's strings may
/// not be UTF-8 (see [`super::notify`]).
pub fn encode_frame(kind: FrameType, json: impl AsRef<[u8]>) -> Vec<u8> {
    let json = json.as_ref();
    let type_len = usize::from(kind.byte().is_some());
    let length = type_len + json.len() + 1;
    let mut out = Vec::with_capacity(8 + length);
    out.extend_from_slice(&(length as u64).to_le_bytes());
    if let Some(b) = kind.byte() {
        out.push(b);
    }
    out.extend_from_slice(json);
    out.push(b'\n');
    out
}

/// Data-port opcodes.
pub(crate) const OP_READ_V1: u8 = 0x00;
pub(crate) const OP_WRITE_V1: u8 = 0x01;
pub(crate) const OP_READ_V2: u8 = 0x80;
pub(crate) const OP_WRITE_V2: u8 = 0x81;
const V2_FLAG: u8 = 0x80;

/// Size of the request header on the data port.
pub(crate) const HEADER_LEN: usize = 24;
/// Size of the v2 status frame.
pub(crate) const STATUS_LEN: usize = 8;
const STATUS_MAGIC: u32 = 0x4D43_5456; // "MCTV"

/// A decoded data-port request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub size: u64,
    pub addr: u64,
    pub direction: Direction,
    /// v2 requests are acknowledged with a status frame.
    pub acknowledged: bool,
}

impl RequestHeader {
    /// Encode as the raw C struct `{u64 size; u64 addr; u8 opcode}` with zero
    /// padding.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let opcode = match (self.direction, self.acknowledged) {
            (Direction::Read, false) => OP_READ_V1,
            (Direction::Write, false) => OP_WRITE_V1,
            (Direction::Read, true) => OP_READ_V2,
            (Direction::Write, true) => OP_WRITE_V2,
        };
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&self.size.to_le_bytes());
        out[8..16].copy_from_slice(&self.addr.to_le_bytes());
        out[16] = opcode;
        out
    }

    /// Decode; padding is ignored. As Mooncake's server does, any opcode
    /// other than WRITE (after masking the v2 bit) is served as READ.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> RequestHeader {
        let size = u64::from_le_bytes(bytes[0..8].try_into().unwrap_or_default());
        let addr = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
        let opcode = bytes[16];
        let direction = if opcode & !V2_FLAG == OP_WRITE_V1 { Direction::Write } else { Direction::Read };
        RequestHeader { size, addr, direction, acknowledged: opcode & V2_FLAG != 0 }
    }
}

/// v2 status codes.
pub(crate) const STATUS_OK: u32 = 0;
pub(crate) const STATUS_REJECTED: u32 = 1;

/// Encode a v2 status frame.
pub fn encode_status(code: u32) -> [u8; STATUS_LEN] {
    ((u64::from(STATUS_MAGIC) << 32) | u64::from(code)).to_le_bytes()
}

/// Decode a v2 status frame; `None` when the magic is wrong (a legacy or
/// broken peer).
pub fn decode_status(bytes: [u8; STATUS_LEN]) -> Option<u32> {
    let v = u64::from_le_bytes(bytes);
    ((v >> 32) as u32 == STATUS_MAGIC).then_some(v as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_matches_captured_bytes() {
        // v2 WRITE of 100 bytes to 0x7f158b6fb010, as seen on the wire.
        let h = RequestHeader { size: 100, addr: 0x7f15_8b6f_b010, direction: Direction::Write, acknowledged: true };
        let expected = [0x64, 0, 0, 0, 0, 0, 0, 0, 0x10, 0xb0, 0x6f, 0x8b, 0x15, 0x7f, 0, 0, 0x81, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(h.encode(), expected);
        assert_eq!(RequestHeader::decode(&expected), h);
    }

    #[test]
    fn opcodes_decode_like_the_reference_server() {
        let mut b = [0u8; HEADER_LEN];
        for (op, dir, ack) in [
            (0x00, Direction::Read, false),
            (0x01, Direction::Write, false),
            (0x80, Direction::Read, true),
            (0x81, Direction::Write, true),
            (0x05, Direction::Read, false),
            (0x82, Direction::Read, true),
        ] {
            b[16] = op;
            b[17..].fill(0xff); // padding is ignored
            let h = RequestHeader::decode(&b);
            assert_eq!((h.direction, h.acknowledged), (dir, ack), "opcode {op:#x}");
        }
    }

    #[test]
    fn status_frames() {
        assert_eq!(encode_status(0), [0, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d]);
        assert_eq!(encode_status(1), [1, 0, 0, 0, 0x56, 0x54, 0x43, 0x4d]);
        assert_eq!(decode_status(encode_status(1)), Some(1));
        assert_eq!(decode_status([0; 8]), None);
    }

    #[test]
    fn frames_round_trip_and_lengths_are_bounded() {
        let f = encode_frame(FrameType::Probe, "{}");
        assert_eq!(f, [4, 0, 0, 0, 0, 0, 0, 0, 3, b'{', b'}', b'\n']);
        let len = check_frame_length(f[..8].try_into().unwrap(), 1 << 20).unwrap();
        assert_eq!(split_frame_body(&f[8..8 + len]), (FrameType::Probe, &b"{}\n"[..]));
        let old = encode_frame(FrameType::Old, "{}");
        assert_eq!(old[..8], 3u64.to_le_bytes());
        assert_eq!(split_frame_body(&old[8..]).0, FrameType::Old);
        assert_eq!(check_frame_length([0; 8], 1 << 20), Err(FrameLengthError::Empty));
        assert!(matches!(check_frame_length(u64::MAX.to_le_bytes(), 1 << 20), Err(FrameLengthError::TooLong { .. })));
        assert_eq!(split_frame_body(&[]).0, FrameType::Old);
    }
}
