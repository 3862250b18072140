//! Peer authentication (`PDX_PEER_SECRET_FILE`): two pdx engines holding the
//! same secret prove it to each other, on every handshake connection and
//! every data connection, by HMAC-SHA-256 over fresh nonces of both sides.
//! A party without the secret gets no descriptor (so learns no regions),
//! cannot notify, and no data connection of its is served; a recorded
//! exchange replayed later fails, because the other side's nonce differs.
//!
//! Handshake port (frames `[len u64 LE][AUTH_FRAME][JSON]`, beside the
//! Mooncake frames, which a Mooncake engine cannot send):
//! 1. client → server: `{"client_nonce": cn}`;
//! 2. server → client: `{"server_nonce": sn, "proof": MAC("pdx-handshake-server", cn, sn)}`;
//!    the client checks it (a server without the secret cannot answer);
//! 3. client → server: `{"proof": MAC("pdx-handshake-client", cn, sn, SHA-256(request frame))}`,
//!    then the request frame itself, which the server serves only if the
//!    proof holds for it.
//!
//! Data port: the pdx hello (`hello.rs`) carries the nonces: the
//! request `{"instance", "nonce": cn}`, the reply `{"instance", "nonce": sn,
//! "proof": MAC("pdx-data-server", cn, sn, instance)}`, and one more hello
//! from the client, `{"proof": MAC("pdx-data-client", cn, sn, instance)}`,
//! before its first request.
//!
//! Each MAC input is the label and every part, each part preceded by its
//! length (u64 LE), so no two inputs read the same. Proofs compare in
//! constant time. The traffic itself is not encrypted: an attacker on the
//! path can still read or change it (see SECURITY.md).

use std::io::{Read, Write};

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind, Result};

/// The type byte of an authentication frame on the handshake port ('P':
/// above Mooncake's types, and not `{`, so a Mooncake or pdx engine without
/// a secret reads it as malformed and closes).
pub(crate) const AUTH_FRAME: u8 = 0x50;
/// Largest authentication frame body.
const MAX_AUTH_FRAME: usize = 1024;

pub(crate) const HANDSHAKE_SERVER: &str = "pdx-handshake-server";
pub(crate) const HANDSHAKE_CLIENT: &str = "pdx-handshake-client";
pub(crate) const DATA_SERVER: &str = "pdx-data-server";
pub(crate) const DATA_CLIENT: &str = "pdx-data-client";

/// A fresh nonce: 128 random bits as 32 hex digits, from the kernel (a
/// forked process never repeats its parent's).
pub(crate) fn nonce() -> String {
    let mut bytes = [0u8; 16];
    // SAFETY: `bytes` is writable for its length; getrandom writes at most that.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got != bytes.len() as isize {
        // No kernel entropy call: mix what differs between processes and
        // instants (fastrand's own state is copied by fork).
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let mix = fastrand::u128(..) ^ nanos ^ (u128::from(std::process::id()) << 64);
        bytes = mix.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac_of(secret: &[u8], label: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(label.as_bytes());
    for p in parts {
        mac.update(&(p.len() as u64).to_le_bytes());
        mac.update(p);
    }
    mac
}

/// The proof (hex) of `label` over `parts`.
pub(crate) fn prove(secret: &[u8], label: &str, parts: &[&[u8]]) -> String {
    mac_of(secret, label, parts).finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `proof` (hex) is the proof of `label` over `parts` (constant time).
pub(crate) fn verify(secret: &[u8], label: &str, parts: &[&[u8]], proof: &str) -> bool {
    let Some(bytes) = unhex(proof) else { return false };
    mac_of(secret, label, parts).verify_slice(&bytes).is_ok()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

/// SHA-256 of a request frame, as the client's proof covers it.
pub(crate) fn digest(frame: &[u8]) -> Vec<u8> {
    Sha256::digest(frame).to_vec()
}

/// The fields of the handshake's authentication frames.
#[derive(Serialize, Deserialize, Default, Debug, PartialEq, Eq)]
pub(crate) struct AuthBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_nonce: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_nonce: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
    /// Why the server refuses the connection (sent to a client that did not
    /// try to authenticate, so that a pdx engine without the secret can say so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An authentication frame carrying `body`.
pub(crate) fn encode_frame(body: &AuthBody) -> Vec<u8> {
    let json = serde_json::to_vec(body).unwrap_or_default();
    let mut out = Vec::with_capacity(9 + json.len());
    out.extend_from_slice(&((json.len() + 1) as u64).to_le_bytes());
    out.push(AUTH_FRAME);
    out.extend_from_slice(&json);
    out
}

/// The body of a handshake frame body (what follows the length prefix) if
/// it is an authentication frame.
pub(crate) fn decode_frame_body(body: &[u8]) -> Option<AuthBody> {
    match body.split_first() {
        Some((&AUTH_FRAME, json)) => serde_json::from_slice(json).ok(),
        _ => None,
    }
}

/// Read one authentication frame (client side: the server's challenge).
fn read_auth_frame(stream: &mut impl Read, what: &str) -> Result<AuthBody> {
    let refused = |why: &str| {
        Error::new(
            ErrorKind::PeerUnreachable,
            format!(
                "{what}: peer authentication failed: {why} (the peer has no PDX_PEER_SECRET_FILE, or is a Mooncake \
                 engine, which cannot authenticate)"
            ),
        )
    };
    let mut prefix = [0u8; 8];
    stream.read_exact(&mut prefix).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            Error::timeout(format!("{what}: no answer to the authentication challenge in time"))
        }
        // Closed before any reply: a target shedding handshakes, or one
        // without the secret; the caller may ask again (ConnectionLost).
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => Error::new(
            ErrorKind::ConnectionLost,
            refused(&format!("it closed the connection at the challenge ({e})")).message(),
        ),
        _ => refused(&format!("it closed the connection at the challenge ({e})")),
    })?;
    let len = u64::from_le_bytes(prefix);
    if len == 0 || len > MAX_AUTH_FRAME as u64 {
        return Err(refused("it answered the challenge with something else"));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).map_err(|e| refused(&format!("its answer was cut short ({e})")))?;
    decode_frame_body(&body).ok_or_else(|| refused("it answered the challenge with something else"))
}

/// The client's side of an authenticated handshake, up to sending
/// `request` (a whole frame): challenge, check the server's proof, prove
/// ours over the request, send it. The reply is read by the caller.
pub(crate) fn client_handshake<S: Read + Write>(
    stream: &mut S,
    secret: &[u8],
    request: &[u8],
    what: &str,
) -> Result<()> {
    let io = |e: std::io::Error| {
        // The target closed before reading the hello (ConnectionLost: the
        // caller may ask again).
        let closed = matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset);
        Error::new(if closed { ErrorKind::ConnectionLost } else { ErrorKind::PeerUnreachable }, format!("{what}: {e}"))
    };
    let cn = nonce();
    let hello = AuthBody { client_nonce: Some(cn.clone()), ..AuthBody::default() };
    stream.write_all(&encode_frame(&hello)).map_err(io)?;
    let answer = read_auth_frame(stream, what)?;
    let (Some(sn), Some(proof)) = (answer.server_nonce, answer.proof) else {
        return Err(Error::new(ErrorKind::PeerUnreachable, format!("{what}: malformed authentication challenge")));
    };
    if !verify(secret, HANDSHAKE_SERVER, &[cn.as_bytes(), sn.as_bytes()], &proof) {
        return Err(Error::new(
            ErrorKind::PeerUnreachable,
            format!("{what}: peer authentication failed: the peer does not hold this engine's peer secret"),
        ));
    }
    let ours = prove(secret, HANDSHAKE_CLIENT, &[cn.as_bytes(), sn.as_bytes(), &digest(request)]);
    let mut out = encode_frame(&AuthBody { proof: Some(ours), ..AuthBody::default() });
    out.extend_from_slice(request);
    stream.write_all(&out).map_err(io)
}

/// The server's side of an authenticated handshake, a frame at a time (for
/// a server that assembles frames as their bytes arrive): after the first
/// frame it awaits the client's proof, then the request it proves.
pub(crate) enum ServerAuth {
    AwaitProof { cn: String, sn: String },
    AwaitRequest { cn: String, sn: String, theirs: String },
}

/// Why a handshake is refused (for the log), with the error frame to send
/// the client, if any.
pub(crate) type Refusal = (Option<Vec<u8>>, &'static str);

/// What a frame after the first leads to.
pub(crate) enum AuthStep {
    /// Another frame is awaited.
    More(ServerAuth),
    /// The body of the request frame, proven with the secret.
    Request(Vec<u8>),
}

const UNAUTHENTICATED: &str =
    "it did not authenticate on the handshake port (a Mooncake peer cannot; a pdx peer needs \
                               the same PDX_PEER_SECRET_FILE)";

impl ServerAuth {
    /// The connection's first frame body: the challenge frame to send, or
    /// why not with the error frame to send (if any).
    pub(crate) fn start(secret: &[u8], first: &[u8]) -> std::result::Result<(ServerAuth, Vec<u8>), Refusal> {
        let Some(AuthBody { client_nonce: Some(cn), .. }) = decode_frame_body(first) else {
            let why = "this engine requires peer authentication (PDX_PEER_SECRET_FILE); the connecting engine has no \
                       peer secret";
            let error = encode_frame(&AuthBody { error: Some(why.to_owned()), ..AuthBody::default() });
            return Err((Some(error), UNAUTHENTICATED));
        };
        if cn.len() > 128 {
            return Err((None, "its authentication challenge is malformed"));
        }
        let sn = nonce();
        let proof = prove(secret, HANDSHAKE_SERVER, &[cn.as_bytes(), sn.as_bytes()]);
        let challenge = AuthBody { server_nonce: Some(sn.clone()), proof: Some(proof), ..AuthBody::default() };
        Ok((ServerAuth::AwaitProof { cn, sn }, encode_frame(&challenge)))
    }

    /// Why the handshake fails if the connection ends before the next frame.
    pub(crate) fn missing(&self) -> &'static str {
        match self {
            ServerAuth::AwaitProof { .. } => "it did not prove the peer secret on the handshake port",
            ServerAuth::AwaitRequest { .. } => "it sent no request after authenticating",
        }
    }

    /// The next frame's body.
    pub(crate) fn on_frame(self, secret: &[u8], body: Vec<u8>) -> std::result::Result<AuthStep, &'static str> {
        match self {
            ServerAuth::AwaitProof { cn, sn } => match decode_frame_body(&body) {
                Some(AuthBody { proof: Some(theirs), .. }) => {
                    Ok(AuthStep::More(ServerAuth::AwaitRequest { cn, sn, theirs }))
                }
                _ => Err("it did not prove the peer secret on the handshake port"),
            },
            ServerAuth::AwaitRequest { cn, sn, theirs } => {
                let mut frame = Vec::with_capacity(8 + body.len());
                frame.extend_from_slice(&(body.len() as u64).to_le_bytes());
                frame.extend_from_slice(&body);
                if !verify(secret, HANDSHAKE_CLIENT, &[cn.as_bytes(), sn.as_bytes(), &digest(&frame)], &theirs) {
                    return Err("its proof of the peer secret is wrong (another secret, or a replayed handshake)");
                }
                Ok(AuthStep::Request(body))
            }
        }
    }
}

/// The server's side of an authenticated handshake: `first` is the body
/// of the connection's first frame (after its length prefix); more frames
/// are read with `read_frame`. Returns the body of the request frame once
/// the client proved the secret over it, or why not (for the log).
pub(crate) fn server_handshake<S: Write>(
    stream: &mut S,
    secret: &[u8],
    first: &[u8],
    mut read_frame: impl FnMut(&mut S) -> Option<Vec<u8>>,
) -> std::result::Result<Vec<u8>, &'static str> {
    let (mut auth, challenge) = match ServerAuth::start(secret, first) {
        Ok(started) => started,
        Err((error, why)) => {
            if let Some(error) = error {
                let _ = stream.write_all(&error);
            }
            return Err(why);
        }
    };
    stream.write_all(&challenge).map_err(|_| "it left during the authentication")?;
    loop {
        let body = read_frame(stream).ok_or_else(|| auth.missing())?;
        match auth.on_frame(secret, body)? {
            AuthStep::More(next) => auth = next,
            AuthStep::Request(request) => return Ok(request),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn proofs_bind_the_secret_the_label_and_every_part() {
        let p = prove(K, DATA_CLIENT, &[b"cn", b"sn"]);
        assert!(verify(K, DATA_CLIENT, &[b"cn", b"sn"], &p));
        assert!(!verify(b"another secret of thirty-two byte", DATA_CLIENT, &[b"cn", b"sn"], &p));
        assert!(!verify(K, DATA_SERVER, &[b"cn", b"sn"], &p), "a server proof is no client proof");
        assert!(!verify(K, DATA_CLIENT, &[b"cn", b"sn2"], &p), "another server nonce: a replay fails");
        assert!(!verify(K, DATA_CLIENT, &[b"c", b"nsn"], &p), "parts are length-prefixed");
        assert!(!verify(K, DATA_CLIENT, &[b"cn", b"sn"], "zz"));
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn frames_round_trip_and_others_are_not_auth_frames() {
        let body = AuthBody { client_nonce: Some("ab".into()), ..AuthBody::default() };
        let f = encode_frame(&body);
        assert_eq!(u64::from_le_bytes(f[..8].try_into().unwrap()) as usize, f.len() - 8);
        assert_eq!(decode_frame_body(&f[8..]), Some(body));
        let mooncake =
            crate::engine::protocol::wire::encode_frame(crate::engine::protocol::wire::FrameType::Metadata, "{}");
        assert_eq!(decode_frame_body(&mooncake[8..]), None);
        // What a pdx or Mooncake engine without a secret sees: the untyped
        // old protocol with a body that is not JSON.
        let (kind, json) = crate::engine::protocol::wire::split_frame_body(&f[8..]);
        assert_eq!(kind, crate::engine::protocol::wire::FrameType::Old);
        assert!(serde_json::from_slice::<serde_json::Value>(json).is_err());
    }
}
