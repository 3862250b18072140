//! Mutation fuzzing of everything a peer can send: the codecs and the
//! descriptor parser (must never panic, whatever the bytes), and the live
//! listeners (must keep serving honest peers while being fed garbage).
//! Deterministic seeds keep failures reproducible.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::protocol::descriptor::{encode_descriptor, parse_descriptor, AdvertisedBuffer};
use super::protocol::wire::{self, FrameType, RequestHeader};
use super::samehost::{Answer, HostIdentity, Offer};
use super::*;
use crate::transfer::host::parse_session;
use crate::transfer::Direction;

/// Seeded, so a failure reproduces.
struct Mutator(fastrand::Rng);

impl Mutator {
    fn seeded(seed: u64) -> Mutator {
        Mutator(fastrand::Rng::with_seed(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.usize(..n.max(1))
    }

    /// A few random edits of `seed`: flips, interesting bytes, inserts,
    /// deletes, truncation, and length-prefix rewrites.
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..1 + self.below(4) {
            let pos = self.below(v.len() + 1);
            match self.below(7) {
                0 if !v.is_empty() => {
                    let (at, bit) = (pos.min(v.len() - 1), self.below(8));
                    v[at] ^= 1 << bit;
                }
                1 if !v.is_empty() => {
                    let interesting = [0u8, 1, 2, 3, 4, 0x7f, 0x80, 0x81, 0xff, b'{', b'}', b'"', b'\\'];
                    let (at, pick) = (pos.min(v.len() - 1), self.below(interesting.len()));
                    v[at] = interesting[pick];
                }
                2 => v.insert(pos, self.next() as u8),
                3 if !v.is_empty() => {
                    v.remove(pos.min(v.len() - 1));
                }
                4 => v.truncate(pos),
                5 if v.len() >= 8 => {
                    let lens = [0u64, 1, 2, 7, 8, 1 << 20, (1 << 20) + 1, u64::MAX, v.len() as u64 - 8];
                    v[..8].copy_from_slice(&lens[self.below(lens.len())].to_le_bytes());
                }
                _ => {
                    let extra: Vec<u8> = (0..self.below(32)).map(|_| self.next() as u8).collect();
                    v.extend(extra);
                }
            }
        }
        v
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let desc = encode_descriptor("127.0.0.1:1", "00ff", "127.0.0.1", 2, &[AdvertisedBuffer { addr: 4096, length: 64 }]);
    vec![
        wire::encode_frame(FrameType::Metadata, &desc),
        wire::encode_frame(FrameType::Probe, "{}"),
        wire::encode_frame(FrameType::Notify, r#"{"name":"a","notify_msg":"b"}"#),
        wire::encode_frame(FrameType::Notify, b"{\"name\":\"\xff\",\"notify_msg\":\"\x8b\\u0000\\udc80\"}"),
        wire::encode_frame(FrameType::Connection, r#"{"qp_num":[1,2],"local_nic_path":"x"}"#),
        wire::encode_frame(FrameType::Old, "{}"),
        RequestHeader { size: 16, addr: 4096, direction: Direction::Write, acknowledged: true }.encode().to_vec(),
        RequestHeader { size: 16, addr: 4096, direction: Direction::Read, acknowledged: false }.encode().to_vec(),
        wire::encode_status(0).to_vec(),
        super::protocol::hello::encode_request("00ff"),
        super::protocol::hello::encode_reply("00ff"),
        desc.into_bytes(),
        // The same-host link: an offer (naming pid 1, which holds none of
        // these connections), an answer, and its request frames.
        super::protocol::hello::encode_request_body(&super::protocol::hello::Body {
            instance: Some("00ff".into()),
            same_host: Some(Offer {
                host: identity(),
                probe_addr: 4096,
                probe: "00".repeat(16),
                nonce_proof: true,
                device_ipc: true,
                answer_after_proof: false,
            }),
            ..Default::default()
        }),
        super::protocol::hello::encode_reply_body(&super::protocol::hello::Body {
            same_host_answer: Some(Answer {
                accepted: true,
                reason: "r".into(),
                device_ipc: true,
                device_reason: "d".into(),
            }),
            ..Default::default()
        }),
        // The target's challenge and the initiator's reply to it.
        super::protocol::hello::encode_reply_body(&super::protocol::hello::Body {
            instance: Some("00ff".into()),
            same_host_challenge: Some("a5".repeat(16)),
            ..Default::default()
        }),
        super::protocol::hello::encode_request_body(&super::protocol::hello::Body {
            same_host_written: true,
            ..Default::default()
        }),
        super::samehost::window::encode(Direction::Write, &Request { local: 4096, remote: 4096, len: 16 }).to_vec(),
        super::samehost::device::encode(
            Direction::Read,
            &Request { local: 4096, remote: 4096, len: 16 },
            &super::memory::ipc::DeviceExport { handle: [7; super::memory::ipc::HANDLE_LEN], offset: 3 },
        )
        .to_vec(),
    ]
}

/// A host identity naming pid 1 (not this process).
fn identity() -> HostIdentity {
    HostIdentity { pid: 1, ..HostIdentity::current().expect("/proc") }
}

#[test]
fn decoders_never_panic() {
    let seeds = seeds();
    let mut m = Mutator::seeded(0x00c0_ffee_1234_5678);
    for _ in 0..100_000 {
        let pick = m.below(seeds.len());
        let input = m.mutate(&seeds[pick]);
        if input.len() >= 8 {
            let prefix: [u8; 8] = input[..8].try_into().unwrap();
            if let Ok(n) = wire::check_frame_length(prefix, 1 << 20) {
                let body = &input[8..input.len().min(8 + n)];
                let (_, json) = wire::split_frame_body(body);
                let _ = parse_descriptor(json, "s:1", "s");
                let _ = super::protocol::notify::decode(json);
            }
            let _ = wire::decode_status(prefix);
            if let Some(n) = super::protocol::hello::reply_body_len(prefix) {
                let _ = super::protocol::hello::decode_body(&input[8..input.len().min(8 + n)]);
            }
        }
        if input.len() >= wire::HEADER_LEN {
            let header: &[u8; wire::HEADER_LEN] = input[..wire::HEADER_LEN].try_into().unwrap();
            let h = RequestHeader::decode(header);
            assert_eq!(RequestHeader::decode(&h.encode()), h);
            let _ = super::samehost::window::decode_local(header);
            let _ = super::samehost::device::decode_ipc(header);
            if let Some(tail) = input.get(wire::HEADER_LEN..wire::HEADER_LEN + super::samehost::device::TAIL_LEN) {
                let _ = super::samehost::device::decode_tail(tail.try_into().unwrap());
            }
            if super::protocol::hello::is_hello(header) {
                if let Some(n) = super::protocol::hello::request_body_len(header) {
                    let _ = super::protocol::hello::decode_body(
                        &input[wire::HEADER_LEN..input.len().min(wire::HEADER_LEN + n)],
                    );
                }
            }
        }
        let _ = parse_descriptor(&input, "s:1", "s");
        let _ = parse_session(&String::from_utf8_lossy(&input), 12001);
    }
}

#[test]
fn listeners_survive_garbage_and_keep_serving() {
    let honest = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
    let victim = Engine::start_with("127.0.0.1", Settings::from_env()).unwrap();
    let memory = vec![0u8; 1 << 16];
    victim.register(memory.as_ptr() as u64, memory.len() as u64).unwrap();
    let (rpc, data) = (victim.rpc_port(), victim.data_port());
    let mut seeds = seeds();
    // Data-plane seeds aimed at the registered region.
    for (size, op) in [(16u64, Direction::Write), (64, Direction::Read), (1 << 16, Direction::Write)] {
        let h = RequestHeader { size, addr: memory.as_ptr() as u64, direction: op, acknowledged: true };
        seeds.push(h.encode().to_vec());
    }
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let seeds = &seeds;
            s.spawn(move || {
                let mut m = Mutator::seeded(0xdead_beef ^ (t + 1));
                for _ in 0..150 {
                    let pick = m.below(seeds.len());
                    let input = m.mutate(&seeds[pick]);
                    let port = if m.below(2) == 0 { rpc } else { data };
                    let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else { continue };
                    let _ = c.set_read_timeout(Some(Duration::from_millis(50)));
                    let _ = c.write_all(&input);
                    if m.below(2) == 0 {
                        let _ = c.shutdown(std::net::Shutdown::Write);
                    }
                    let mut sink = [0u8; 4096];
                    let _ = c.read(&mut sink);
                }
            });
        }
    });
    let src = vec![9u8; 1 << 16];
    let r = Request { local: src.as_ptr() as usize, remote: memory.as_ptr() as u64, len: src.len() };
    // SAFETY: the test's buffers outlive the call (and every batch it starts).
    unsafe { honest.transfer_sync(victim.session_id(), Direction::Write, vec![r]) }.unwrap();
    assert!(memory == src);
    honest.probe(victim.session_id()).unwrap();
    // `memory` drops before `victim`: withdraw it first, so that no data
    // thread still draining a garbage write writes into freed memory.
    victim.unregister(memory.as_ptr() as u64).unwrap();
}
