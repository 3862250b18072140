//! The pdx-only opening of a data connection ("hello"): before its first
//! request, an initiator that planned against a pdx descriptor asks the
//! engine behind the data port to confirm it is the instance named there.
//! A port reused by another process (a restarted peer's old data port taken
//! by someone else) answers with another instance, or not at all, and the
//! initiator fetches the descriptor again instead of writing into it.
//!
//! A Mooncake peer never sees a hello: pdx sends one only to a peer whose
//! descriptor carries `pdx_instance`, a field Mooncake does not write (and
//! ignores when reading ours). Should a hello reach a server that does not
//! know it, it reads as a v1 read of an address no region can hold (beyond
//! the 47-bit user address space), which every server refuses by closing
//! the connection: nothing is read or written.
//!
//! Frames (all integers little-endian):
//! - request: a 24-byte data header with `size` = body length (at most
//!   [`MAX_BODY`]), `addr` = [`HELLO_ADDR`], opcode [`OP_HELLO`]; then the
//!   body, JSON `{"instance":"<32 hex>"}` (the instance expected);
//! - reply: u64 `REPLY_MAGIC << 32 | body length`, then JSON
//!   `{"instance":"<32 hex>"}` (the instance answering). A server whose
//!   instance is not the one expected replies and closes the connection.
//!
//! The JSON bodies leave room for what later extensions of the connection
//! (a same-host link, peer authentication) need to say; unknown fields are
//! ignored.
//!
//! With a peer secret (`PDX_PEER_SECRET_FILE`) the hello also authenticates
//! the connection (see [`super::auth`]): the request adds `"nonce"` (the
//! initiator's), the reply adds `"nonce"` (the server's) and `"proof"`, and
//! the initiator sends one more hello, `{"proof": ...}`, before its first
//! request. A server with a secret serves no connection that did not prove
//! it; an initiator with one sends nothing to a server that did not.
//!
//! The hello also carries an extension of the connection it does not
//! interpret itself, the same-host link: an offer (`"same_host"`, a JSON
//! object the link writes and reads, see [`Offering`]) may be challenged
//! before it is answered: the target replies
//! `{"instance":..., "same_host_challenge":"<32 hex>"}`, the initiator's
//! link meets the challenge and the initiator sends one more hello,
//! `{"same_host_written":true}`; the target then replies with its answer
//! (`"same_host_answer"`, again the link's JSON). With a peer secret this
//! happens after the initiator's proof, for an offer that says
//! `"answer_after_proof":true`; an older offer without it is answered
//! unchecked at once. What the offer and answer say, and what the challenge
//! proves, is the link's (`docs/wire.md`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::net::conn::Conn;
use super::super::net::deadline::BoundedStream;
use super::wire::HEADER_LEN;
use crate::error::{Error, ErrorKind, Result};

/// Opcode of a hello: not a Mooncake opcode (after masking bit 7 it is not
/// a write, so a server that does not know it treats it as a v1 read).
pub(crate) const OP_HELLO: u8 = 0x50;
/// The `addr` field of a hello ("pdxhello"): far outside any user address
/// space, so no registered region can contain it.
pub(crate) const HELLO_ADDR: u64 = u64::from_le_bytes(*b"pdxhello");
/// Largest hello body either side accepts.
pub(crate) const MAX_BODY: usize = 4096;
/// "PDXH": the upper half of the reply's length word.
const REPLY_MAGIC: u32 = 0x5044_5848;

/// An engine instance: 128 random bits drawn when the engine starts, as 32
/// lowercase hex digits. A restarted engine (or one in a forked process)
/// never reuses one.
pub(crate) fn new_instance() -> String {
    super::auth::nonce()
}

/// A hello body: the instance (expected or answering), and with a peer
/// secret the nonce and proof.
#[derive(Serialize, Deserialize, Default, Debug, PartialEq, Eq)]
pub(crate) struct Body {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
    /// Request: the initiator offers the same-host link (the link's JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_host: Option<Value>,
    /// Reply: the target's answer to that offer (the link's JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_host_answer: Option<Value>,
    /// Reply: the answer to the offer comes in one more reply, after the
    /// initiator's proof (the target holds a peer secret and checks
    /// nothing of an offer before the proof).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub same_host_after_proof: bool,
    /// Reply: a fresh nonce (hex) the initiator must write at its offer's
    /// probe address before the target answers the offer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_host_challenge: Option<String>,
    /// Request: the initiator wrote the challenge's nonce.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub same_host_written: bool,
}

/// The initiator's side of an extension of the connection the hello carries
/// without interpreting it (the same-host link): its offer, and its answer
/// to the target's challenge.
pub(crate) trait Offering {
    /// The offer (a JSON object); `answer_after_proof`: this initiator
    /// holds a peer secret and waits for the answer until after its proof.
    fn offer(&mut self, answer_after_proof: bool) -> Value;
    /// Meet the target's challenge before the initiator says it did; false
    /// if the challenge is malformed.
    fn meet(&mut self, challenge: &str) -> bool;
}

/// Whether an offer waits for its answer until after the initiator's proof
/// of the peer secret (an older one does not, and is answered at once).
fn answers_after_proof(offer: &Value) -> bool {
    offer.get("answer_after_proof").and_then(Value::as_bool).unwrap_or(false)
}

/// True if `header` opens a hello; its `size` is the body length.
pub(crate) fn is_hello(header: &[u8; HEADER_LEN]) -> bool {
    header[16] == OP_HELLO && header[8..16] == HELLO_ADDR.to_le_bytes()
}

/// The request: header and body asking for `expected`.
#[cfg(test)]
pub(crate) fn encode_request(expected: &str) -> Vec<u8> {
    encode_request_body(&Body { instance: Some(expected.to_owned()), ..Body::default() })
}

/// A request (header and body) carrying `body`.
pub(crate) fn encode_request_body(body: &Body) -> Vec<u8> {
    let body = serde_json::to_vec(body).unwrap_or_default();
    let mut out = Vec::with_capacity(HEADER_LEN + body.len());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&HELLO_ADDR.to_le_bytes());
    out.push(OP_HELLO);
    out.extend_from_slice(&[0u8; HEADER_LEN - 17]);
    out.extend_from_slice(&body);
    out
}

/// The body length a hello header announces, if acceptable.
pub(crate) fn request_body_len(header: &[u8; HEADER_LEN]) -> Option<usize> {
    let len = u64::from_le_bytes(header[0..8].try_into().ok()?);
    usize::try_from(len).ok().filter(|&l| l > 0 && l <= MAX_BODY)
}

/// The instance a body names.
#[cfg(test)]
pub(crate) fn decode_body(body: &[u8]) -> Option<String> {
    decode(body)?.instance
}

/// A hello body's fields.
pub(crate) fn decode(body: &[u8]) -> Option<Body> {
    serde_json::from_slice(body).ok()
}

/// The reply naming `own`.
#[cfg(test)]
pub(crate) fn encode_reply(own: &str) -> Vec<u8> {
    encode_reply_body(&Body { instance: Some(own.to_owned()), ..Body::default() })
}

/// A reply carrying `body`.
pub(crate) fn encode_reply_body(body: &Body) -> Vec<u8> {
    let body = serde_json::to_vec(body).unwrap_or_default();
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&((u64::from(REPLY_MAGIC) << 32) | body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The body length of a reply prefix, if it is a hello reply.
pub(crate) fn reply_body_len(prefix: [u8; 8]) -> Option<usize> {
    let word = u64::from_le_bytes(prefix);
    let len = (word & 0xffff_ffff) as usize;
    ((word >> 32) as u32 == REPLY_MAGIC && len > 0 && len <= MAX_BODY).then_some(len)
}

/// Ask the engine behind `stream` to confirm it is `expected`, all by
/// `deadline`; with `secret`, both sides also prove they hold it; with
/// `offer`, offer the same-host link and return the answer (`None`: the
/// engine did not answer it). `what` names the connection for error
/// texts. Anything but a well-formed reply naming `expected` is an error:
/// the caller then treats its descriptor as stale.
pub(crate) fn confirm(
    stream: &mut TcpStream,
    expected: &str,
    deadline: Instant,
    what: &str,
    secret: Option<&[u8]>,
    mut offer: Option<&mut dyn Offering>,
) -> Result<Option<Value>> {
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            Error::timeout(format!("{what}: no answer to the pdx hello within the connect bound"))
        }
        // A server that does not know hello closes without a word.
        std::io::ErrorKind::UnexpectedEof => {
            Error::new(ErrorKind::PeerUnreachable, format!("{what}: closed at the pdx hello (not a pdx engine)"))
        }
        _ => Error::new(ErrorKind::PeerUnreachable, format!("{what}: {e}")),
    };
    let not_the_peer = |why: &str| Error::new(ErrorKind::PeerUnreachable, format!("{what}: {why}"));
    let mut bounded = BoundedStream::new(stream, deadline);
    let cn = secret.map(|_| super::auth::nonce());
    // With a secret, the target answers the offer only after our proof.
    let body = offer.as_mut().map(|o| o.offer(secret.is_some()));
    let request = Body { instance: Some(expected.to_owned()), nonce: cn.clone(), same_host: body, ..Body::default() };
    bounded.write_all(&encode_request_body(&request)).map_err(io)?;
    let read_reply = |bounded: &mut BoundedStream<'_>| -> Result<Body> {
        let mut prefix = [0u8; 8];
        bounded.read_exact(&mut prefix).map_err(io)?;
        let len =
            reply_body_len(prefix).ok_or_else(|| not_the_peer("answered the pdx hello with a malformed reply"))?;
        let mut body = vec![0u8; len];
        bounded.read_exact(&mut body).map_err(io)?;
        decode(&body).ok_or_else(|| not_the_peer("answered the pdx hello with a malformed body"))
    };
    // The reply that may challenge the offer: met by the link, then the
    // answer comes in one more reply.
    let settle =
        |reply: Body, bounded: &mut BoundedStream<'_>, offer: &mut Option<&mut dyn Offering>| -> Result<Body> {
            let Some(nonce) = &reply.same_host_challenge else { return Ok(reply) };
            if !offer.as_mut().is_some_and(|o| o.meet(nonce)) {
                return Err(not_the_peer("sent a malformed same-host challenge, or one to no offer"));
            }
            let written = Body { same_host_written: true, ..Body::default() };
            bounded.write_all(&encode_request_body(&written)).map_err(io)?;
            read_reply(bounded)
        };
    let mut reply = read_reply(&mut bounded)?;
    let instance = reply.instance.take().ok_or_else(|| not_the_peer("answered the pdx hello with a malformed body"))?;
    if instance != expected {
        return Err(not_the_peer(&format!("is engine instance {instance}, not {expected} (the port was reused)")));
    }
    let (Some(secret), Some(cn)) = (secret, cn) else {
        return Ok(settle(reply, &mut bounded, &mut offer)?.same_host_answer);
    };
    let answer = reply.same_host_answer.take();
    use super::auth::{prove, verify, DATA_CLIENT, DATA_SERVER};
    let proven = match (&reply.nonce, &reply.proof) {
        (Some(sn), Some(proof)) => {
            verify(secret, DATA_SERVER, &[cn.as_bytes(), sn.as_bytes(), expected.as_bytes()], proof).then_some(sn)
        }
        _ => None,
    };
    let Some(sn) = proven else {
        return Err(not_the_peer(
            "peer authentication failed: the engine did not prove it holds this engine's peer secret",
        ));
    };
    let ours = prove(secret, DATA_CLIENT, &[cn.as_bytes(), sn.as_bytes(), expected.as_bytes()]);
    bounded.write_all(&encode_request_body(&Body { proof: Some(ours), ..Body::default() })).map_err(io)?;
    if reply.same_host_after_proof && answer.is_none() {
        let after = read_reply(&mut bounded)?;
        return Ok(settle(after, &mut bounded, &mut offer)?.same_host_answer);
    }
    Ok(answer)
}

/// How long a target waits for the initiator's reply to its challenge.
const CHALLENGE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The target's side of a same-host challenge on `conn`: send `nonce` (in
/// a reply that also names this engine's instance `own`) and wait for the
/// initiator's `same_host_written`; `Err` says why it did not come.
pub(crate) fn challenge(conn: &mut Conn, own: &str, nonce: &str) -> std::result::Result<(), String> {
    let reply = Body { instance: Some(own.to_owned()), same_host_challenge: Some(nonce.to_owned()), ..Body::default() };
    conn.send_all(&encode_reply_body(&reply)).map_err(|e| format!("sending it: {e}"))?;
    // The reply needs a round trip: wait through the socket's receive
    // slices (a loaded initiator may take longer than one), up to a bound.
    // A slice that ends mid-message keeps what it read (`recv_exact_by`).
    let by = std::time::Instant::now() + CHALLENGE_WAIT;
    let mut header = [0u8; HEADER_LEN];
    conn.recv_exact_by(&mut header, by).map_err(|e| format!("waiting for the reply: {e}"))?;
    let Some(len) = is_hello(&header).then(|| request_body_len(&header)).flatten() else {
        return Err("a request came instead of the reply".to_owned());
    };
    let mut body = vec![0u8; len];
    conn.recv_exact_by(&mut body, by).map_err(|e| format!("its reply was cut short: {e}"))?;
    match decode(&body) {
        Some(b) if b.same_host_written => Ok(()),
        _ => Err("its reply does not say it wrote the nonce".to_owned()),
    }
}

/// The server's side of an authenticated data-connection hello: `request`
/// is the first hello's body, naming this engine's instance. Replies with
/// this engine's instance, its nonce and proof, then reads the initiator's
/// proof (one more hello). A same-host offer is checked (`check` with the
/// connection) only once that proof holds, and answered in one more reply;
/// an older pdx that does not wait for it is answered at once, unchecked
/// (`check` without a connection). `Err` says why the connection is
/// refused.
pub(crate) fn serve_data_hello(
    conn: &mut Conn,
    secret: &[u8],
    own: &str,
    request: Body,
    check: &mut dyn FnMut(&Value, Option<&mut Conn>) -> Value,
) -> std::result::Result<(), &'static str> {
    let Some(cn) = request.nonce.filter(|n| n.len() <= 128) else {
        return Err("its pdx hello carried no nonce (a pdx engine without a peer secret)");
    };
    let after_proof = request.same_host.as_ref().is_some_and(answers_after_proof);
    let unchecked = request.same_host.as_ref().filter(|o| !answers_after_proof(o)).map(|o| check(o, None));
    let sn = super::auth::nonce();
    let proof = super::auth::prove(secret, super::auth::DATA_SERVER, &[cn.as_bytes(), sn.as_bytes(), own.as_bytes()]);
    let reply = Body {
        instance: Some(own.to_owned()),
        nonce: Some(sn.clone()),
        proof: Some(proof),
        same_host_answer: unchecked,
        same_host_after_proof: after_proof,
        ..Body::default()
    };
    conn.send_all(&encode_reply_body(&reply)).map_err(|_| "it left during the hello")?;
    let mut header = [0u8; super::wire::HEADER_LEN];
    conn.recv_exact(&mut header).map_err(|_| "it sent no proof after the hello")?;
    let len = is_hello(&header).then(|| request_body_len(&header)).flatten();
    let Some(len) = len else { return Err("it sent a request instead of its proof") };
    let mut body = vec![0u8; len];
    conn.recv_exact(&mut body).map_err(|_| "its proof was cut short")?;
    let theirs = decode(&body).and_then(|b| b.proof).unwrap_or_default();
    if !super::auth::verify(secret, super::auth::DATA_CLIENT, &[cn.as_bytes(), sn.as_bytes(), own.as_bytes()], &theirs)
    {
        return Err("its proof of the peer secret is wrong (another secret, or a replayed connection)");
    }
    if let Some(offer) = request.same_host.as_ref().filter(|_| after_proof) {
        let answer = Body { same_host_answer: Some(check(offer, Some(conn))), ..Body::default() };
        conn.send_all(&encode_reply_body(&answer)).map_err(|_| "it left before the same-host answer")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::Direction;

    #[test]
    fn a_hello_is_recognised_and_reads_as_a_refused_read_elsewhere() {
        let req = encode_request("00112233445566778899aabbccddeeff");
        let header: [u8; HEADER_LEN] = req[..HEADER_LEN].try_into().unwrap();
        assert!(is_hello(&header));
        assert_eq!(request_body_len(&header), Some(req.len() - HEADER_LEN));
        assert_eq!(decode_body(&req[HEADER_LEN..]).as_deref(), Some("00112233445566778899aabbccddeeff"));
        // What a server that does not know hello sees: a v1 read at an
        // address above every user address space.
        let seen = super::super::wire::RequestHeader::decode(&header);
        assert_eq!((seen.direction, seen.acknowledged), (Direction::Read, false));
        assert!(seen.addr > 1 << 56, "{:#x}", seen.addr);
        // A real request is never a hello.
        let mut other = header;
        other[16] = super::super::wire::OP_READ_V1;
        assert!(!is_hello(&other));
    }

    #[test]
    fn replies_round_trip_and_bad_ones_are_refused() {
        let reply = encode_reply("ab");
        let len = reply_body_len(reply[..8].try_into().unwrap()).unwrap();
        assert_eq!(decode_body(&reply[8..8 + len]).as_deref(), Some("ab"));
        assert_eq!(reply_body_len([0; 8]), None);
        assert_eq!(reply_body_len(((u64::from(REPLY_MAGIC) << 32) | (MAX_BODY as u64 + 1)).to_le_bytes()), None);
        assert_eq!(decode_body(b"{\"instance\":3}"), None);
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(request_body_len(&header), None);
    }

    #[test]
    fn instances_differ() {
        let a = new_instance();
        assert_eq!(a.len(), 32);
        assert_ne!(a, new_instance());
    }
    /// The initiator's reply to a same-host challenge, arriving in pieces
    /// with pauses longer than the target's receive slice: the challenge
    /// reads all of it (a retry after a slice that ended mid-message
    /// started the message over, losing the bytes it had read).
    #[test]
    fn a_challenge_reply_in_pieces_is_read_whole() {
        use crate::engine::net::conn::Conn;
        use std::time::Duration;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let initiator = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (target, _) = l.accept().unwrap();
        let slice = Duration::from_millis(30);
        let mut target = Conn::new(target, slice, slice).unwrap();
        let mut initiator = Conn::new(initiator, Duration::from_secs(5), Duration::from_secs(5)).unwrap();
        let answering = std::thread::spawn(move || {
            let mut prefix = [0u8; 8];
            initiator.recv_exact(&mut prefix).unwrap();
            let mut body = vec![0u8; reply_body_len(prefix).unwrap()];
            initiator.recv_exact(&mut body).unwrap();
            assert_eq!(decode(&body).unwrap().same_host_challenge.as_deref(), Some("n0"));
            let written = encode_request_body(&Body { same_host_written: true, ..Body::default() });
            for piece in written.chunks(5) {
                initiator.send_all(piece).unwrap();
                std::thread::sleep(slice * 2);
            }
            initiator
        });
        assert_eq!(challenge(&mut target, "own", "n0"), Ok(()));
        drop(answering.join().unwrap());
    }
}
