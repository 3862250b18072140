//! Planning a batch, before any socket: requests are cut into pieces
//! (bounded, so windows stay bounded and a large request can spread over
//! lanes; a device piece fits one staging buffer), pieces are claimed in
//! windows (bounded in requests and bytes, never spanning two devices), and
//! the batch's size picks how many lanes it may use. Pure: no engine, no
//! I/O; the executor (`batch`) runs what this plans over a link.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::transfer::Request;

/// Requests larger than this travel as several pieces.
pub(crate) const PIECE_BYTES: usize = 4 << 20;
/// Bytes per extra lane a single batch may use.
const LANE_FANOUT_BYTES: usize = 64 << 20;
/// Requests per window, and bytes per window (more pipelining buys nothing
/// once a window covers several socket buffers).
pub(crate) const WINDOW_REQUESTS: usize = 256;
pub(crate) const WINDOW_BYTES: usize = 8 << 20;

/// Most pieces [`Plan::peek`] adds up.
const PEEK_PIECES: usize = 1024;

/// Where a request's local bytes are: host memory, or device memory of the
/// device with this ordinal (staged).
pub(crate) type Kind = Option<u32>;

/// A batch cut into pieces, with the cursor lanes claim windows from.
pub(crate) struct Plan {
    pub pieces: Vec<Request>,
    /// The task (request index) each piece belongs to.
    pub piece_task: Vec<usize>,
    /// Where each piece's local bytes are (empty when all are host memory).
    pub piece_kind: Vec<Kind>,
    /// Pieces per task (0 for an empty request).
    pub task_pieces: Vec<usize>,
    cursor: AtomicUsize,
}

impl Plan {
    /// Cut `reqs` into pieces of at most [`PIECE_BYTES`], device ones (per
    /// `kinds`, empty when all are host memory) into pieces of at most
    /// `device_piece`. Empty requests get no piece.
    pub fn new(reqs: &[Request], kinds: &[Kind], device_piece: usize) -> Plan {
        let mut plan = Plan {
            pieces: Vec::with_capacity(reqs.len()),
            piece_task: Vec::with_capacity(reqs.len()),
            piece_kind: Vec::new(),
            task_pieces: Vec::with_capacity(reqs.len()),
            cursor: AtomicUsize::new(0),
        };
        for (i, r) in reqs.iter().enumerate() {
            let kind = kinds.get(i).copied().flatten();
            let limit = if kind.is_some() { PIECE_BYTES.min(device_piece.max(1)) } else { PIECE_BYTES };
            let mut off = 0;
            let mut count = 0;
            while off < r.len {
                let len = (r.len - off).min(limit);
                plan.pieces.push(Request { local: r.local + off, remote: r.remote + off as u64, len });
                plan.piece_task.push(i);
                if !kinds.is_empty() {
                    plan.piece_kind.push(kind);
                }
                off += len;
                count += 1;
            }
            plan.task_pieces.push(count);
        }
        plan
    }

    /// Cut the host pieces of the batch's last `tail` bytes (or fewer)
    /// further, into pieces of at most `piece` bytes, so that lanes of
    /// several rails share the end of a batch finely while the rest keeps
    /// its larger pieces (and windows). Adds at most `tail / piece` pieces.
    /// Only before any claim.
    pub fn split_tail(&mut self, tail: usize, piece: usize) {
        let piece = piece.max(1);
        let mut covered = 0usize;
        let mut first = self.pieces.len();
        while first > 0 && covered < tail {
            covered = covered.saturating_add(self.pieces[first - 1].len);
            first -= 1;
        }
        if self.pieces[first..].iter().all(|p| p.len <= piece) {
            return;
        }
        let has_kinds = !self.piece_kind.is_empty();
        let (mut pieces, mut tasks, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
        for i in first..self.pieces.len() {
            let (r, task, kind) = (self.pieces[i], self.piece_task[i], self.kind(i));
            if kind.is_some() || r.len <= piece {
                pieces.push(r);
                tasks.push(task);
                kinds.push(kind);
                continue;
            }
            let mut off = 0;
            while off < r.len {
                let len = (r.len - off).min(piece);
                pieces.push(Request { local: r.local + off, remote: r.remote + off as u64, len });
                tasks.push(task);
                kinds.push(kind);
                off += len;
            }
            self.task_pieces[task] += r.len.div_ceil(piece) - 1;
        }
        self.pieces.truncate(first);
        self.piece_task.truncate(first);
        self.pieces.extend(pieces);
        self.piece_task.extend(tasks);
        if has_kinds {
            self.piece_kind.truncate(first);
            self.piece_kind.extend(kinds);
        }
    }

    /// Bytes of all pieces.
    pub fn bytes(&self) -> usize {
        self.pieces.iter().map(|r| r.len).fold(0usize, usize::saturating_add)
    }

    /// Lanes worth using: one pipelined lane keeps up with loopback on this
    /// class of machine (64 KiB x 256 at 5.6 GB/s on one lane, 4.5 on
    /// four); only very large batches fan out, for links one stream cannot
    /// fill.
    pub fn lanes(&self, lanes_per_peer: usize) -> usize {
        (self.bytes() / LANE_FANOUT_BYTES).clamp(1, lanes_per_peer.max(1))
    }

    /// Where piece `i`'s local bytes are.
    pub fn kind(&self, i: usize) -> Kind {
        self.piece_kind.get(i).copied().flatten()
    }

    /// Claim the next window: at most [`WINDOW_REQUESTS`] pieces and
    /// [`WINDOW_BYTES`] (a larger piece alone), never pieces of two devices.
    /// Safe to call from several lanes at once; every piece is claimed once.
    pub fn claim(&self) -> Option<Range<usize>> {
        self.claim_within(WINDOW_BYTES)
    }

    /// [`Plan::claim`] of at most `max_bytes` (a larger piece alone): the
    /// lanes of several rails take smaller windows, so that the end of a
    /// batch is shared finely between rails of different speeds.
    pub fn claim_within(&self, max_bytes: usize) -> Option<Range<usize>> {
        let n = self.pieces.len();
        loop {
            let start = self.cursor.load(Ordering::Acquire);
            if start >= n {
                return None;
            }
            let end = self.window_end(start, max_bytes);
            if self.cursor.compare_exchange(start, end, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                return Some(start..end);
            }
        }
    }

    /// The next window's bytes and the unclaimed bytes (`usize::MAX` past
    /// [`PEEK_PIECES`] pieces: "plenty", so a claim costs no walk of a
    /// long batch); `None`: nothing left.
    pub fn peek(&self, max_bytes: usize) -> Option<(usize, usize)> {
        let start = self.cursor.load(Ordering::Acquire);
        if start >= self.pieces.len() {
            return None;
        }
        let sum = |r: &[Request]| r.iter().map(|p| p.len).fold(0usize, usize::saturating_add);
        let rest = &self.pieces[start..];
        let unclaimed = if rest.len() > PEEK_PIECES { usize::MAX } else { sum(rest) };
        Some((sum(&self.pieces[start..self.window_end(start, max_bytes)]), unclaimed))
    }

    fn window_end(&self, start: usize, max_bytes: usize) -> usize {
        let n = self.pieces.len();
        let mut end = start;
        let mut bytes = 0usize;
        let mut device: Kind = None;
        while end < n && end - start < WINDOW_REQUESTS && (end == start || bytes + self.pieces[end].len <= max_bytes) {
            match (device, self.kind(end)) {
                (Some(d), Some(k)) if d != k => break,
                (None, Some(k)) => device = Some(k),
                _ => {}
            }
            bytes += self.pieces[end].len;
            end += 1;
        }
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(len: usize) -> Request {
        Request { local: 0x10000, remote: 0x20000, len }
    }

    #[test]
    fn requests_are_cut_into_bounded_pieces_and_empty_ones_get_none() {
        let p = Plan::new(&[req(PIECE_BYTES * 2 + 1), req(0), req(5)], &[], 0);
        assert_eq!(p.pieces.iter().map(|r| r.len).collect::<Vec<_>>(), vec![PIECE_BYTES, PIECE_BYTES, 1, 5]);
        assert_eq!(p.piece_task, vec![0, 0, 0, 2]);
        assert_eq!(p.task_pieces, vec![3, 0, 1]);
        assert_eq!(p.pieces[1].local, 0x10000 + PIECE_BYTES);
        assert_eq!(p.pieces[2].remote, 0x20000 + 2 * PIECE_BYTES as u64);
        assert!(p.piece_kind.is_empty());
    }

    #[test]
    fn device_pieces_fit_a_staging_buffer() {
        let p = Plan::new(&[req(10_000), req(10_000)], &[Some(1), None], 4096);
        let lens: Vec<usize> = p.pieces.iter().map(|r| r.len).collect();
        assert_eq!(lens, vec![4096, 4096, 1808, 10_000]);
        assert_eq!(p.piece_kind, vec![Some(1), Some(1), Some(1), None]);
    }

    #[test]
    fn windows_are_bounded_and_never_span_two_devices() {
        let many = Plan::new(&vec![req(1); WINDOW_REQUESTS + 3], &[], 0);
        assert_eq!(many.claim(), Some(0..WINDOW_REQUESTS));
        assert_eq!(many.claim(), Some(WINDOW_REQUESTS..WINDOW_REQUESTS + 3));
        assert_eq!(many.claim(), None);
        let big = Plan::new(&[req(WINDOW_BYTES / 2), req(WINDOW_BYTES / 2 + 1), req(PIECE_BYTES)], &[], 0);
        let mut windows = Vec::new();
        while let Some(w) = big.claim() {
            windows.push(w);
        }
        assert_eq!(windows.iter().map(|w| w.len()).sum::<usize>(), big.pieces.len());
        assert!(windows
            .iter()
            .all(|w| w.len() == 1 || big.pieces[w.clone()].iter().map(|r| r.len).sum::<usize>() <= WINDOW_BYTES));
        // Host pieces ride with the device run before or after them.
        let kinds = [None, Some(0), None, Some(0), Some(3), None, Some(3)];
        let mixed = Plan::new(&[req(1); 7], &kinds, 4096);
        assert_eq!((mixed.claim(), mixed.claim(), mixed.claim()), (Some(0..4), Some(4..7), None));
    }

    #[test]
    fn lanes_claim_every_piece_exactly_once() {
        let p = std::sync::Arc::new(Plan::new(&vec![req(3000); 5000], &[], 0));
        let claimed: Vec<Range<usize>> = std::thread::scope(|s| {
            let lanes: Vec<_> = (0..4)
                .map(|_| {
                    let p = p.clone();
                    s.spawn(move || std::iter::from_fn(|| p.claim()).collect::<Vec<_>>())
                })
                .collect();
            lanes.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let mut seen = vec![0u8; 5000];
        for w in claimed {
            for i in w {
                seen[i] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
    }

    #[test]
    fn peek_sees_the_next_window_and_what_is_left() {
        let p = Plan::new(&[req(PIECE_BYTES * 3), req(5)], &[], 0);
        assert_eq!(p.peek(WINDOW_BYTES), Some((2 * PIECE_BYTES, 3 * PIECE_BYTES + 5)));
        assert_eq!(p.peek(PIECE_BYTES), Some((PIECE_BYTES, 3 * PIECE_BYTES + 5)));
        assert_eq!(p.claim_within(PIECE_BYTES), Some(0..1));
        assert_eq!(p.peek(WINDOW_BYTES), Some((2 * PIECE_BYTES, 2 * PIECE_BYTES + 5)));
        assert_eq!(p.claim(), Some(1..3));
        assert_eq!(p.peek(WINDOW_BYTES), Some((5, 5)));
        p.claim();
        assert_eq!(p.peek(WINDOW_BYTES), None);
        let long = Plan::new(&vec![req(1); PEEK_PIECES + 1], &[], 0);
        assert_eq!(long.peek(WINDOW_BYTES), Some((WINDOW_REQUESTS, usize::MAX)), "a long batch is not walked");
    }

    #[test]
    fn the_tail_is_cut_finer_and_the_rest_is_kept() {
        let mut p = Plan::new(&[req(PIECE_BYTES * 3), req(5), req(PIECE_BYTES + 1)], &[], 0);
        p.split_tail(PIECE_BYTES + 2, 1 << 20);
        let lens: Vec<usize> = p.pieces.iter().map(|r| r.len).collect();
        let m = 1 << 20;
        assert_eq!(lens, vec![PIECE_BYTES, PIECE_BYTES, PIECE_BYTES, 5, m, m, m, m, 1]);
        assert_eq!(p.task_pieces, vec![3, 1, 5]);
        assert_eq!(p.piece_task, vec![0, 0, 0, 1, 2, 2, 2, 2, 2]);
        assert_eq!(p.pieces[7].remote, 0x20000 + 3 * m as u64);
        assert_eq!(p.bytes(), 4 * PIECE_BYTES + 6);
        // Device pieces keep their staging-sized pieces.
        let mut d = Plan::new(&[req(8192), req(8192)], &[None, Some(0)], 4096);
        d.split_tail(1 << 30, 1000);
        assert_eq!(d.pieces.len(), 9 + 2);
        assert_eq!(d.piece_kind.len(), d.pieces.len());
        assert_eq!(d.task_pieces, vec![9, 2]);
    }

    #[test]
    fn only_large_batches_fan_out() {
        assert_eq!(Plan::new(&[req(1 << 20)], &[], 0).lanes(8), 1);
        assert_eq!(Plan::new(&[req(200 << 20)], &[], 0).lanes(8), 3);
        assert_eq!(Plan::new(&[req(2000 << 20)], &[], 0).lanes(8), 8);
    }
}
