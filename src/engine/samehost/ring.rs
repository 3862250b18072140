//! The link's proven request channel: the target serves a same-host
//! request only after reading it, through the kernel, from the memory of
//! the process its hello pinned, never from the connection.
//!
//! Why: the hello proves once which process speaks on the connection, but
//! a socket can be held by more processes than the one that proved it (a
//! forked child keeps its parent's sockets, and may drop to another user).
//! A request taken from the socket would come from whoever wrote it, and the
//! target, copying with its own rights, would move memory of the process
//! it pinned on their behalf.
//!
//! How: each link has a ring ([`RING_LEN`] bytes of *private anonymous*
//! memory of the initiator, named in the offer and pinned with the link).
//! The initiator writes one message at a time there (a head with the link's
//! key, a sequence number, a kind and a count, then whole entries) and rings
//! a [`Doorbell`] on the connection (length and sequence number only). On
//! the doorbell the target reads the message from the pinned process with
//! `process_vm_readv` (bracketed: the process runs before and after, see
//! [`PeerProcess`]), checks the key (the hello's challenge nonce, which only
//! the two sides hold) and that the sequence number is the next one (one
//! message serves once), and only then serves what it lists. A process that
//! merely holds the socket can ring, but the bytes the target reads are the
//! pinned process's own: a forked child's writes land in its own copy of
//! the ring (copy on write; the kernel even wipes the copy at fork,
//! `MADV_WIPEONFORK`), which the target never reads. Only a process that can
//! already write the initiator's memory could forge a request, and such a
//! process gains nothing it did not have.
//!
//! Messages list the initiator's registered memory ([`Kind::Regions`],
//! [`Kind::MoreRegions`], acknowledged with one status each) or carry a
//! window of requests ([`Kind::Host`], [`Kind::Device`], one status per
//! request); the target copies the initiator's bytes only inside what the
//! link listed (checked per request). The initiator writes the next message
//! only once the target answered the last one (it read the ring before it
//! answered), so one slot is the whole ring.
//!
//! Extending it: anything more the initiator tells the target about its
//! requests needs the same proof, so it is a new [`Kind`] of message, or a
//! word in the ring the target reads the same way. While a message is
//! served the target reads nothing from the connection; to stop serving
//! requests already announced (a cancel), the initiator can write a word
//! past the message area that the target re-reads between requests (8 bytes
//! through the kernel, from the pinned process).

use std::io;
use std::ptr::NonNull;

use parking_lot::Mutex;

use super::super::memory::ipc::DeviceExport;
use super::super::protocol::wire::RequestHeader;
use super::frames::{decode_device, decode_host, Doorbell, DEVICE_FRAME_LEN, HOST_FRAME_LEN};
use super::xmem::PeerProcess;

/// Bytes of an initiator's ring: the longest message.
pub(crate) const RING_LEN: usize = 64 << 10;
/// The longest ring a target reads from (what an offer may name): the
/// most a link makes the target hold for one message, as a connection's
/// receive buffer does.
pub(crate) const MAX_RING_LEN: u64 = 256 << 10;
/// Length of the link's key (the hello's challenge nonce).
pub(crate) const KEY_LEN: usize = 16;
/// A message's head: key, `u64` sequence number, `u8` kind, 3 zero bytes,
/// `u32` count of entries.
pub(crate) const HEAD_LEN: usize = KEY_LEN + 16;
/// Most ranges of the initiator's memory a target keeps listed for a link
/// (256 KiB of them; an initiator's memory past them rides TCP).
pub(crate) const MAX_LISTED: usize = 1 << 14;
/// Bytes of one listed range: `u64` start, `u64` length.
const RANGE_LEN: usize = 16;

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The initiator's registered memory: replaces the list.
    Regions = 1,
    /// More of it: added to the list.
    MoreRegions = 2,
    /// A window of host-memory requests.
    Host = 3,
    /// A window of device-memory requests (CUDA IPC).
    Device = 4,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        [Kind::Regions, Kind::MoreRegions, Kind::Host, Kind::Device].into_iter().find(|k| *k as u8 == b)
    }

    /// Bytes of one entry.
    pub fn entry_len(self) -> usize {
        match self {
            Kind::Regions | Kind::MoreRegions => RANGE_LEN,
            Kind::Host => HOST_FRAME_LEN,
            Kind::Device => DEVICE_FRAME_LEN,
        }
    }

    /// Most entries one message holds.
    pub fn max_entries(self) -> usize {
        (RING_LEN - HEAD_LEN) / self.entry_len()
    }
}

/// The head of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    key: [u8; KEY_LEN],
    seq: u64,
    kind: u8,
    count: u32,
}

impl Head {
    fn encode(&self) -> [u8; HEAD_LEN] {
        let mut out = [0u8; HEAD_LEN];
        out[..KEY_LEN].copy_from_slice(&self.key);
        out[KEY_LEN..KEY_LEN + 8].copy_from_slice(&self.seq.to_le_bytes());
        out[KEY_LEN + 8] = self.kind;
        out[KEY_LEN + 12..].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Head> {
        let head = bytes.get(..HEAD_LEN)?;
        let key = head[..KEY_LEN].try_into().ok()?;
        let seq = u64::from_le_bytes(head[KEY_LEN..KEY_LEN + 8].try_into().ok()?);
        let count = u32::from_le_bytes(head[KEY_LEN + 12..].try_into().ok()?);
        let padded = head[KEY_LEN + 9..KEY_LEN + 12].iter().all(|&b| b == 0);
        padded.then_some(Head { key, seq, kind: head[KEY_LEN + 8], count })
    }
}

/// The initiator's ring: [`RING_LEN`] bytes of private anonymous memory
/// (never shared with another process, not even a forked child).
pub(crate) struct Ring(NonNull<u8>);

// SAFETY: the mapping belongs to this value alone; moving it to another
// thread moves that ownership.
unsafe impl Send for Ring {}

impl Ring {
    pub fn new() -> io::Result<Ring> {
        // SAFETY: a new anonymous private mapping; no file, no fixed address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                RING_LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // A forked child's copy reads as zeros (hygiene only: the target
        // never reads a child's copy). Kernels before 4.14 lack it.
        // SAFETY: our own mapping, its whole length.
        unsafe { libc::madvise(p, RING_LEN, libc::MADV_WIPEONFORK) };
        NonNull::new(p.cast()).map(Ring).ok_or_else(|| io::Error::other("mmap returned a null mapping"))
    }

    /// Its address in this process (what the offer names).
    pub fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    /// Write `bytes` at offset `at`; false (nothing written) past the end.
    fn put(&mut self, at: usize, bytes: &[u8]) -> bool {
        if at.checked_add(bytes.len()).is_none_or(|end| end > RING_LEN) {
            return false;
        }
        // SAFETY: `at .. at + len` lies in our mapping of RING_LEN bytes;
        // `bytes` is another allocation.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.0.as_ptr().add(at), bytes.len()) };
        true
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once.
        unsafe { libc::munmap(self.0.as_ptr().cast(), RING_LEN) };
    }
}

/// Whether the sorted, merged ranges `listed` (start, end) wholly contain
/// `[addr, addr + len)` within one of them (never for an empty range).
fn covered(listed: &[(u64, u64)], addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len).filter(|_| len > 0) else { return false };
    let i = listed.partition_point(|&(start, _)| start <= addr);
    i > 0 && end <= listed[i - 1].1
}

/// `ranges` (start, end) sorted, overlapping and touching ones merged.
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (start, end) in ranges {
        match out.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

/// The initiator's end of a link: its ring, the key, the next sequence
/// number, the process it was made for, and what the target holds as this
/// process's registered memory.
pub(crate) struct InitiatorLink {
    ring: Ring,
    key: [u8; KEY_LEN],
    next_seq: u64,
    made_for: u32,
    /// The ranges (start, end) the target holds, merged, and the version of
    /// the registered memory they came from.
    listed: Vec<(u64, u64)>,
    listed_version: Option<(u64, usize)>,
}

impl InitiatorLink {
    /// The link of `ring` with `key`, made by this process.
    pub fn new(ring: Ring, key: [u8; KEY_LEN]) -> InitiatorLink {
        InitiatorLink {
            ring,
            key,
            next_seq: 1,
            made_for: super::this_process(),
            listed: Vec::new(),
            listed_version: None,
        }
    }

    /// Whether the target holds `[addr, addr + len)` as registered memory of
    /// this process.
    pub fn covers(&self, addr: u64, len: usize) -> bool {
        covered(&self.listed, addr, len as u64)
    }

    /// The version of the registered memory the target holds, if listed.
    pub fn listed_version(&self) -> Option<(u64, usize)> {
        self.listed_version
    }

    /// The target now holds `ranges` (start, length) of `version`.
    pub fn set_listed(&mut self, version: (u64, usize), ranges: &[(u64, u64)]) {
        self.listed = merged(ranges.iter().map(|&(a, l)| (a, a.saturating_add(l))).collect());
        self.listed_version = Some(version);
    }

    /// Write a message of `kind` with `entries` (whole entries, at most
    /// [`Kind::max_entries`]) into the ring: the doorbell announcing it;
    /// `None` (nothing written) for entries that do not fit, and in any
    /// process but the one the link was made for (a forked child: the
    /// target would read its parent's ring, never the child's).
    pub fn post(&mut self, kind: Kind, entries: &[u8]) -> Option<Doorbell> {
        let count = entries.len() / kind.entry_len();
        if entries.len() % kind.entry_len() != 0 || count > kind.max_entries() || self.made_for != super::this_process()
        {
            return None;
        }
        let head = Head { key: self.key, seq: self.next_seq, kind: kind as u8, count: count as u32 };
        // The entries first, the head last: a message is whole once its head is.
        if !(self.ring.put(HEAD_LEN, entries) && self.ring.put(0, &head.encode())) {
            return None;
        }
        self.next_seq += 1;
        Some(Doorbell { seq: head.seq, len: (HEAD_LEN + entries.len()) as u64 })
    }
}

#[cfg(test)]
impl InitiatorLink {
    /// Tests: where the ring is, and the message and doorbell the next
    /// [`InitiatorLink::post`] of `kind` with `entries` would write and ring.
    pub fn next_message(&self, kind: Kind, entries: &[u8]) -> (u64, Vec<u8>, Doorbell) {
        let message = encode_message(&self.key, self.next_seq, kind, entries);
        let bell = Doorbell { seq: self.next_seq, len: message.len() as u64 };
        (self.ring.addr(), message, bell)
    }
}

/// The listed ranges `entries` encode, as (start, length).
pub(crate) fn encode_ranges(ranges: &[(u64, u64)]) -> Vec<u8> {
    ranges.iter().flat_map(|&(a, l)| a.to_le_bytes().into_iter().chain(l.to_le_bytes())).collect()
}

/// What a message asked of the target.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// The initiator's registered memory was listed (answered with one OK).
    Listed,
    /// Host-memory requests: header and the initiator's address.
    Host(Vec<(RequestHeader, u64)>),
    /// Device-memory requests: header and the initiator's bytes.
    Device(Vec<(RequestHeader, DeviceExport)>),
}

/// Why a doorbell is not served.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Reading the ring failed (the mechanism: the initiator goes back to TCP).
    Copy(io::Error),
    /// Not a message of the pinned process's link: the connection closes.
    Violation(String),
}

/// The target's end of a link: the pinned process, where its ring is, the
/// key, the next sequence number and the initiator's listed memory.
pub(crate) struct TargetLink {
    peer: PeerProcess,
    ring_addr: u64,
    ring_len: u64,
    key: [u8; KEY_LEN],
    state: Mutex<TargetState>,
}

struct TargetState {
    next_seq: u64,
    /// The initiator's registered memory (start, end), merged.
    listed: Vec<(u64, u64)>,
    /// The last message read.
    buf: Vec<u8>,
}

impl TargetLink {
    /// The link to `peer` (pinned, checked), whose ring of `ring_len` bytes
    /// is at `ring_addr` in it, with `key`.
    pub fn new(peer: PeerProcess, ring_addr: u64, ring_len: u64, key: [u8; KEY_LEN]) -> TargetLink {
        let state = TargetState { next_seq: 1, listed: Vec::new(), buf: Vec::new() };
        TargetLink { peer, ring_addr, ring_len: ring_len.min(MAX_RING_LEN), key, state: Mutex::new(state) }
    }

    /// The process granted the link.
    pub fn peer(&self) -> &PeerProcess {
        &self.peer
    }

    /// Whether the initiator listed `[addr, addr + len)` as its registered
    /// memory (the second fence: nothing else of it is ever copied).
    pub fn covers(&self, addr: u64, len: u64) -> bool {
        covered(&self.state.lock().listed, addr, len)
    }

    /// Read and check the message `bell` announces, from the pinned
    /// process's ring.
    pub fn take(&self, bell: Doorbell) -> Result<Message, Refusal> {
        let mut guard = self.state.lock();
        let TargetState { next_seq, listed, buf } = &mut *guard;
        if bell.seq != *next_seq {
            return Err(Refusal::Violation(format!(
                "a doorbell for message {} while message {next_seq} is next (a process other than the one that \
                 writes the ring rang it, or it rang twice)",
                bell.seq
            )));
        }
        if bell.len < HEAD_LEN as u64 || bell.len > self.ring_len {
            let why = format!("a doorbell for {} bytes; the ring holds {}", bell.len, self.ring_len);
            return Err(Refusal::Violation(why));
        }
        let len = bell.len as usize;
        buf.resize(len, 0);
        // SAFETY: `buf` is `len` writable bytes.
        unsafe { self.peer.read_from(self.ring_addr, buf.as_mut_ptr(), len) }.map_err(Refusal::Copy)?;
        let parsed = parse(buf, &self.key, bell.seq).map_err(Refusal::Violation)?;
        *next_seq += 1;
        match parsed {
            Parsed::Ranges { replace, ranges } => {
                let mut all = if replace { Vec::new() } else { std::mem::take(listed) };
                all.extend(ranges);
                *listed = merged(all);
                if listed.len() > MAX_LISTED {
                    listed.clear();
                    return Err(Refusal::Violation(format!("more than {MAX_LISTED} listed ranges")));
                }
                Ok(Message::Listed)
            }
            Parsed::Requests(m) => Ok(m),
        }
    }
}

/// What a message says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// Ranges (start, end) of the initiator's registered memory, replacing
    /// the list or added to it.
    Ranges { replace: bool, ranges: Vec<(u64, u64)> },
    /// Requests.
    Requests(Message),
}

/// The message in `bytes` (a head and its entries, nothing more), checked
/// against the link's `key` and the sequence number `seq` its doorbell
/// named; `Err` says what is wrong with it. Pure: any bytes, no panic.
pub(crate) fn parse(bytes: &[u8], key: &[u8; KEY_LEN], seq: u64) -> Result<Parsed, String> {
    let head = Head::decode(bytes).ok_or("a malformed message head")?;
    if head.key != *key {
        return Err("the initiator's ring holds no message of this link (its key differs)".to_owned());
    }
    if head.seq != seq {
        return Err(format!(
            "the initiator's ring holds message {}, not {seq} (the doorbell was not rung by the process that wrote \
             the ring)",
            head.seq
        ));
    }
    let kind = Kind::from_byte(head.kind).ok_or_else(|| format!("a message of kind {}", head.kind))?;
    let body = &bytes[HEAD_LEN..];
    if body.len() != head.count as usize * kind.entry_len() {
        return Err(format!("a message of {} bytes for {} entries", body.len(), head.count));
    }
    let requests = match kind {
        Kind::Regions | Kind::MoreRegions => {
            let mut ranges = Vec::with_capacity(body.len() / RANGE_LEN);
            for e in body.chunks_exact(RANGE_LEN) {
                let (start, length) = (le(&e[..8]), le(&e[8..]));
                match start.checked_add(length).filter(|_| length > 0) {
                    Some(end) => ranges.push((start, end)),
                    None => return Err(format!("a listed range {start:#x}+{length}: empty or wrapping")),
                }
            }
            return Ok(Parsed::Ranges { replace: kind == Kind::Regions, ranges });
        }
        Kind::Host => body.chunks_exact(HOST_FRAME_LEN).map(decode_host).collect::<Option<_>>().map(Message::Host),
        Kind::Device => {
            body.chunks_exact(DEVICE_FRAME_LEN).map(decode_device).collect::<Option<_>>().map(Message::Device)
        }
    };
    requests.map(Parsed::Requests).ok_or_else(|| "a malformed request in the initiator's ring".to_owned())
}

/// A message's bytes as [`InitiatorLink::post`] writes them (tests).
#[cfg(test)]
pub(crate) fn encode_message(key: &[u8; KEY_LEN], seq: u64, kind: Kind, entries: &[u8]) -> Vec<u8> {
    let count = (entries.len() / kind.entry_len()) as u32;
    let mut out = Head { key: *key, seq, kind: kind as u8, count }.encode().to_vec();
    out.extend_from_slice(entries);
    out
}

/// A little-endian `u64` of 8 bytes (0 for any other length).
fn le(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::super::frames::encode_host;
    use super::*;
    use crate::transfer::{Direction, Request};

    const KEY: [u8; KEY_LEN] = [0x5a; KEY_LEN];

    #[test]
    fn ranges_merge_and_cover_only_whole_requests_inside_one() {
        let listed = merged(vec![(300, 400), (100, 200), (150, 250), (250, 260), (400, 500)]);
        assert_eq!(listed, vec![(100, 260), (300, 500)]);
        assert!(covered(&listed, 100, 160) && covered(&listed, 300, 200) && covered(&listed, 259, 1));
        assert!(!covered(&listed, 99, 2) && !covered(&listed, 250, 60) && !covered(&listed, 499, 2));
        assert!(!covered(&listed, 100, 0) && !covered(&listed, u64::MAX, 2) && !covered(&[], 1, 1));
    }

    #[test]
    fn messages_parse_only_with_their_key_sequence_and_length() {
        let req = Request { local: 0x1000, remote: 0x2000, len: 64 };
        let frames: Vec<u8> = [encode_host(Direction::Write, &req), encode_host(Direction::Read, &req)].concat();
        let m = encode_message(&KEY, 7, Kind::Host, &frames);
        match parse(&m, &KEY, 7).unwrap() {
            Parsed::Requests(Message::Host(reqs)) => {
                assert_eq!(reqs.len(), 2);
                assert_eq!((reqs[0].0.direction, reqs[0].0.size, reqs[0].1), (Direction::Write, 64, 0x1000));
                assert_eq!(reqs[1].0.direction, Direction::Read);
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&m, &[0; KEY_LEN], 7).unwrap_err().contains("key"));
        assert!(parse(&m, &KEY, 8).unwrap_err().contains("holds message 7, not 8"));
        assert!(parse(&m[..m.len() - 1], &KEY, 7).unwrap_err().contains("entries"));
        assert!(parse(&m[..HEAD_LEN - 1], &KEY, 7).is_err());
        let mut unknown = m.clone();
        unknown[KEY_LEN + 8] = 9;
        assert!(parse(&unknown, &KEY, 7).unwrap_err().contains("kind 9"));
        let mut garbled = m.clone();
        garbled[HEAD_LEN + 16] = 0x50; // not a host request's opcode
        assert!(parse(&garbled, &KEY, 7).unwrap_err().contains("malformed request"));
        let ranges = encode_message(&KEY, 1, Kind::MoreRegions, &encode_ranges(&[(4096, 10)]));
        assert_eq!(parse(&ranges, &KEY, 1), Ok(Parsed::Ranges { replace: false, ranges: vec![(4096, 4106)] }));
        for bad in [(0, 0), (u64::MAX, 2)] {
            let m = encode_message(&KEY, 1, Kind::Regions, &encode_ranges(&[bad]));
            assert!(parse(&m, &KEY, 1).unwrap_err().contains("empty or wrapping"), "{bad:?}");
        }
    }

    /// Both ends in this process: what the initiator posts, the target reads
    /// from its ring, once, in order; another key, an old or future
    /// sequence number and a length past the ring are refused.
    #[test]
    fn the_target_serves_each_posted_message_once_and_in_order() {
        let mut ours = InitiatorLink::new(Ring::new().unwrap(), KEY);
        let me = PeerProcess::open(std::process::id()).unwrap();
        let target = TargetLink::new(me, ours.ring.addr(), RING_LEN as u64, KEY);
        let buf = vec![7u8; 4096];
        let listed = ours.post(Kind::Regions, &encode_ranges(&[(buf.as_ptr() as u64, 4096)])).unwrap();
        assert_eq!(target.take(listed).unwrap(), Message::Listed);
        assert!(target.covers(buf.as_ptr() as u64, 4096) && !target.covers(buf.as_ptr() as u64, 4097));
        let req = Request { local: buf.as_ptr() as usize, remote: 0x2000, len: 4096 };
        let bell = ours.post(Kind::Host, &encode_host(Direction::Write, &req)).unwrap();
        assert_eq!(bell.seq, 2);
        let violation = |r: Result<Message, Refusal>| match r {
            Err(Refusal::Violation(why)) => why,
            other => panic!("{other:?}"),
        };
        // Too long for the ring, or the message after the next: refused
        // before anything is read.
        assert!(violation(target.take(Doorbell { len: RING_LEN as u64 + 1, ..bell })).contains("ring holds"));
        assert!(violation(target.take(Doorbell { seq: 3, ..bell })).contains("message 2 is next"));
        match target.take(bell).unwrap() {
            Message::Host(reqs) => assert_eq!(reqs[0].1, buf.as_ptr() as u64),
            other => panic!("{other:?}"),
        }
        // Rung again (a replay): refused.
        assert!(violation(target.take(bell)).contains("message 3 is next"));
        // The next doorbell, but the ring still holds the last message (what
        // a doorbell rung by another process finds).
        assert!(violation(target.take(Doorbell { seq: 3, ..bell })).contains("holds message 2, not 3"));
        // A link with another key (another hello's) reads nothing of ours.
        let other =
            TargetLink::new(PeerProcess::open(std::process::id()).unwrap(), ours.ring.addr(), 4096, [1; KEY_LEN]);
        let mut other_state = other.state.lock();
        other_state.next_seq = 2;
        drop(other_state);
        assert!(violation(other.take(bell)).contains("key differs"));
        // Another process than the one it was made for never writes the ring.
        ours.made_for = std::process::id().wrapping_add(1);
        assert!(ours.post(Kind::Host, &[]).is_none());
    }
}
