//! KV-cache page plans: which bytes of a paged KV cache move where, planned
//! once and turned into transfer requests per buffer (layer) on demand.
//!
//! SGLang's rule (`conn.py`, `group_concurrent_contiguous`): the page pairs
//! `(src_pages[i], dst_pages[i])` are cut into maximal runs that are
//! consecutive on both sides, in the given order (no sorting); each run
//! becomes one request per buffer. With a head slice (heterogeneous TP) each
//! token's slice is one piece, and consecutive tokens merge when both sides
//! are contiguous, i.e. when the slice is a whole token on both sides; the
//! plan then issues exactly as many requests as without heads. Requests are
//! never merged across runs or across buffers.
//!
//! A plan is pure: it checks its inputs once, copies what it needs, knows no
//! engine and no registration, and can be shared between threads.

use super::Request;
use crate::error::{Error, Result};

/// Most buffers in one plan (a model has a few hundred layer buffers).
pub(crate) const MAX_BUFFERS: usize = 1 << 16;
/// Most page pairs in one plan.
pub(crate) const MAX_PAGES: usize = 1 << 26;

/// One buffer (a layer's K, V or MLA buffer, an aux or state buffer) on one
/// side: page `i` starts at `base + i * page_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBuffer {
    pub base: u64,
    pub page_bytes: u64,
    pub pages: u64,
}

/// A heterogeneous-TP head slice: a page is token-major (a token's heads
/// side by side, then the next token); heads `[local_first, local_first +
/// count)` of each local token go to heads `[remote_first, remote_first +
/// count)` of the remote token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvHeads {
    pub tokens_per_page: u32,
    pub local_heads: u32,
    pub remote_heads: u32,
    pub local_first: u32,
    pub remote_first: u32,
    pub count: u32,
    pub head_bytes: u64,
}

/// A maximal run of page pairs consecutive on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRun {
    /// First local (source) page.
    pub src: u64,
    /// First remote (destination) page.
    pub dst: u64,
    /// Pages in the run (at least 1).
    pub len: u64,
}

/// How one run of one buffer becomes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pieces {
    /// One request per run: whole pages, or a head slice that is a whole
    /// token on both sides.
    PerRun,
    /// One request per token of the run (`count` heads each).
    PerToken {
        tokens_per_page: u64,
        local_token_bytes: u64,
        remote_token_bytes: u64,
        local_offset: u64,
        remote_offset: u64,
        slice_bytes: u64,
    },
}

/// A checked, reusable page plan.
#[derive(Debug, Clone)]
pub struct KvPlan {
    local: Vec<KvBuffer>,
    remote: Vec<KvBuffer>,
    runs: Vec<PageRun>,
    pages: u64,
    pieces: Pieces,
    /// Some local page appears twice: a READ would write it twice.
    src_repeats: Option<(usize, usize, i32)>,
}

fn buffer_checks(side: &str, buffers: &[KvBuffer]) -> Result<()> {
    for (i, b) in buffers.iter().enumerate() {
        if b.base == 0 {
            return Err(Error::invalid_argument(format!("{side}[{i}].base is 0")));
        }
        if b.page_bytes == 0 {
            return Err(Error::invalid_argument(format!("{side}[{i}].page_bytes is 0")));
        }
        if b.pages.checked_mul(b.page_bytes).and_then(|span| b.base.checked_add(span)).is_none() {
            return Err(Error::invalid_argument(format!(
                "{side}[{i}]: base {:#x} + pages {} x page_bytes {} overflows 64 bits",
                b.base, b.pages, b.page_bytes
            )));
        }
    }
    Ok(())
}

/// The buffer with the fewest pages (every index must be below its count).
fn smallest(buffers: &[KvBuffer]) -> (usize, u64) {
    buffers.iter().enumerate().map(|(i, b)| (i, b.pages)).min_by_key(|&(_, p)| p).unwrap_or((0, 0))
}

fn index_checks(what: &str, indices: &[i32], side: &str, buffers: &[KvBuffer]) -> Result<()> {
    let (at, limit) = smallest(buffers);
    for (i, &p) in indices.iter().enumerate() {
        if p < 0 {
            return Err(Error::invalid_argument(format!("{what}[{i}] is {p}, below 0")));
        }
        if p as u64 >= limit {
            return Err(Error::invalid_argument(format!("{what}[{i}] is {p}, not below {side}[{at}].pages {limit}")));
        }
    }
    Ok(())
}

fn heads_checks(h: &KvHeads, local: &[KvBuffer], remote: &[KvBuffer]) -> Result<Pieces> {
    for (name, v) in [
        ("tokens_per_page", u64::from(h.tokens_per_page)),
        ("local_heads", u64::from(h.local_heads)),
        ("remote_heads", u64::from(h.remote_heads)),
        ("count", u64::from(h.count)),
        ("head_bytes", h.head_bytes),
    ] {
        if v == 0 {
            return Err(Error::invalid_argument(format!("heads.{name} is 0")));
        }
    }
    for (side, first, heads) in [("local", h.local_first, h.local_heads), ("remote", h.remote_first, h.remote_heads)] {
        let end = u64::from(first) + u64::from(h.count);
        if end > u64::from(heads) {
            return Err(Error::invalid_argument(format!(
                "heads.{side}_first {first} + heads.count {} = {end} is above heads.{side}_heads {heads}: \
                 the slice leaves the token",
                h.count
            )));
        }
    }
    let mut page_bytes = [0u64; 2];
    for (k, (side, heads, buffers)) in
        [("local", h.local_heads, local), ("remote", h.remote_heads, remote)].into_iter().enumerate()
    {
        let want = u64::from(h.tokens_per_page)
            .checked_mul(u64::from(heads))
            .and_then(|v| v.checked_mul(h.head_bytes))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "heads.tokens_per_page {} x heads.{side}_heads {heads} x heads.head_bytes {} overflows 64 bits",
                    h.tokens_per_page, h.head_bytes
                ))
            })?;
        if let Some((i, b)) = buffers.iter().enumerate().find(|(_, b)| b.page_bytes != want) {
            return Err(Error::invalid_argument(format!(
                "{side}[{i}].page_bytes is {} but heads.tokens_per_page {} x heads.{side}_heads {heads} x \
                 heads.head_bytes {} = {want}",
                b.page_bytes, h.tokens_per_page, h.head_bytes
            )));
        }
        page_bytes[k] = want;
    }
    if h.count == h.local_heads && h.count == h.remote_heads {
        return Ok(Pieces::PerRun);
    }
    let tpp = u64::from(h.tokens_per_page);
    Ok(Pieces::PerToken {
        tokens_per_page: tpp,
        local_token_bytes: page_bytes[0] / tpp,
        remote_token_bytes: page_bytes[1] / tpp,
        local_offset: u64::from(h.local_first) * h.head_bytes,
        remote_offset: u64::from(h.remote_first) * h.head_bytes,
        slice_bytes: u64::from(h.count) * h.head_bytes,
    })
}

/// SGLang's grouping: maximal runs consecutive on both sides, in order.
pub fn page_runs(src: &[i32], dst: &[i32]) -> Vec<PageRun> {
    let mut runs: Vec<PageRun> = Vec::new();
    for (&s, &d) in src.iter().zip(dst) {
        let (s, d) = (s as u64, d as u64);
        match runs.last_mut() {
            Some(r) if r.src + r.len == s && r.dst + r.len == d => r.len += 1,
            _ => runs.push(PageRun { src: s, dst: d, len: 1 }),
        }
    }
    runs
}

/// The first pair `(i, j)`, `i < j`, with `pages[i] == pages[j]`, if any;
/// `runs` are the pages' runs on that side (`start`, `len`).
fn first_repeat(pages: &[i32], runs: impl Iterator<Item = (u64, u64)>) -> Option<(usize, usize)> {
    // Runs cover disjoint ranges unless a page repeats: sort by start and
    // look at neighbours, O(runs log runs); only a repeat costs a full scan.
    let mut spans: Vec<(u64, u64)> = runs.collect();
    spans.sort_unstable();
    if spans.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0) {
        return None;
    }
    let mut seen = std::collections::HashMap::with_capacity(pages.len());
    for (j, &p) in pages.iter().enumerate() {
        if let Some(&i) = seen.get(&p) {
            return Some((i, j));
        }
        seen.insert(p, j);
    }
    None
}

impl KvPlan {
    /// Check everything and build the plan. `local[b]` pairs with
    /// `remote[b]`; `src_pages[i]` (local) with `dst_pages[i]` (remote).
    pub fn new(
        local: &[KvBuffer],
        remote: &[KvBuffer],
        src_pages: &[i32],
        dst_pages: &[i32],
        heads: Option<&KvHeads>,
    ) -> Result<KvPlan> {
        if local.len() != remote.len() {
            return Err(Error::invalid_argument(format!(
                "local has {} buffers but remote has {}",
                local.len(),
                remote.len()
            )));
        }
        if local.is_empty() {
            return Err(Error::invalid_argument("buffers is 0: a plan needs at least one buffer"));
        }
        if local.len() > MAX_BUFFERS {
            return Err(Error::invalid_argument(format!(
                "buffers is {}, over the limit of {MAX_BUFFERS}",
                local.len()
            )));
        }
        if src_pages.len() != dst_pages.len() {
            return Err(Error::invalid_argument(format!(
                "src_pages has {} entries but dst_pages has {}",
                src_pages.len(),
                dst_pages.len()
            )));
        }
        if src_pages.len() > MAX_PAGES {
            return Err(Error::invalid_argument(format!(
                "pages is {}, over the limit of {MAX_PAGES}",
                src_pages.len()
            )));
        }
        buffer_checks("local", local)?;
        buffer_checks("remote", remote)?;
        let pieces = match heads {
            Some(h) => heads_checks(h, local, remote)?,
            None => {
                if let Some((i, (l, r))) =
                    local.iter().zip(remote).enumerate().find(|(_, (l, r))| l.page_bytes != r.page_bytes)
                {
                    return Err(Error::invalid_argument(format!(
                        "local[{i}].page_bytes {} differs from remote[{i}].page_bytes {}: whole pages need equal \
                         sizes (pass heads for a head slice)",
                        l.page_bytes, r.page_bytes
                    )));
                }
                Pieces::PerRun
            }
        };
        index_checks("src_pages", src_pages, "local", local)?;
        index_checks("dst_pages", dst_pages, "remote", remote)?;
        let runs = page_runs(src_pages, dst_pages);
        if let Some((i, j)) = first_repeat(dst_pages, runs.iter().map(|r| (r.dst, r.len))) {
            return Err(Error::invalid_argument(format!(
                "dst_pages[{j}] is {}, as is dst_pages[{i}]: two writes to one page",
                dst_pages[j]
            )));
        }
        let src_repeats =
            first_repeat(src_pages, runs.iter().map(|r| (r.src, r.len))).map(|(i, j)| (i, j, src_pages[j]));
        Ok(KvPlan {
            local: local.to_vec(),
            remote: remote.to_vec(),
            runs,
            pages: src_pages.len() as u64,
            pieces,
            src_repeats,
        })
    }

    /// Buffers in the plan.
    pub fn buffers(&self) -> usize {
        self.local.len()
    }

    /// Page pairs in the plan.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// The runs, in page order.
    pub fn runs(&self) -> &[PageRun] {
        &self.runs
    }

    /// Requests one buffer issues.
    pub fn requests_per_buffer(&self) -> u64 {
        match self.pieces {
            Pieces::PerRun => self.runs.len() as u64,
            // Bounded: pages <= 2^26 and tokens_per_page < 2^32.
            Pieces::PerToken { tokens_per_page, .. } => self.pages * tokens_per_page,
        }
    }

    /// Check a buffer range `[first, end)`.
    pub fn check_range(&self, first: usize, end: usize) -> Result<()> {
        if first >= end {
            return Err(Error::invalid_argument(format!("first_buffer {first} is not below end_buffer {end}")));
        }
        if end > self.buffers() {
            return Err(Error::invalid_argument(format!(
                "end_buffer {end} is past the plan's {} buffers",
                self.buffers()
            )));
        }
        Ok(())
    }

    /// Requests a submit of buffers `[first, end)` issues.
    pub fn request_count(&self, first: usize, end: usize) -> Result<u64> {
        self.check_range(first, end)?;
        // At most 2^16 buffers x 2^58 requests: u128 is exact, then bounded.
        let n = u128::from(self.requests_per_buffer()) * (end - first) as u128;
        u64::try_from(n).map_err(|_| Error::invalid_argument(format!("{n} requests do not fit 64 bits")))
    }

    /// A READ writes the local pages: refuse a plan whose local pages repeat.
    pub fn check_readable(&self) -> Result<()> {
        match self.src_repeats {
            Some((i, j, page)) => Err(Error::invalid_argument(format!(
                "a READ would write local page {page} twice (src_pages[{i}] and src_pages[{j}])"
            ))),
            None => Ok(()),
        }
    }

    /// The requests of buffers `[first, end)`, buffer by buffer, run by run.
    /// `limit` bounds their number (checked before anything is built).
    pub fn requests(&self, first: usize, end: usize, limit: usize) -> Result<Vec<Request>> {
        let n = self.request_count(first, end)?;
        if n > limit as u64 {
            return Err(Error::invalid_argument(format!(
                "buffers [{first}, {end}) issue {n} requests, over the limit of {limit} per batch \
                 (PDX_MAX_BATCH_ENTRIES); submit fewer buffers at once"
            )));
        }
        let mut out = Vec::with_capacity(n as usize);
        for b in first..end {
            self.push_buffer(b, &mut out);
        }
        Ok(out)
    }

    /// Append buffer `b`'s requests. Every address is inside the buffer's
    /// span, checked at construction not to overflow.
    fn push_buffer(&self, b: usize, out: &mut Vec<Request>) {
        let (l, r) = (&self.local[b], &self.remote[b]);
        match self.pieces {
            Pieces::PerRun => out.extend(self.runs.iter().map(|run| Request {
                local: (l.base + run.src * l.page_bytes) as usize,
                remote: r.base + run.dst * r.page_bytes,
                len: (run.len * l.page_bytes) as usize,
            })),
            Pieces::PerToken {
                tokens_per_page,
                local_token_bytes,
                remote_token_bytes,
                local_offset,
                remote_offset,
                slice_bytes,
            } => {
                for run in &self.runs {
                    let first_local = l.base + run.src * l.page_bytes + local_offset;
                    let first_remote = r.base + run.dst * r.page_bytes + remote_offset;
                    out.extend((0..run.len * tokens_per_page).map(|t| Request {
                        local: (first_local + t * local_token_bytes) as usize,
                        remote: first_remote + t * remote_token_bytes,
                        len: slice_bytes as usize,
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    const PAGE: u64 = 256;

    fn bufs(n: usize, base: u64, page_bytes: u64, pages: u64) -> Vec<KvBuffer> {
        (0..n as u64).map(|i| KvBuffer { base: base + i * page_bytes * pages, page_bytes, pages }).collect()
    }

    /// SGLang's planner, written from its rule with numpy's steps: break
    /// where either side's difference is not 1, then one block per run per
    /// layer buffer (`_send_kvcache_generic`), or, for a head slice, one
    /// entry per token slot per page (`send_kvcache_slice`).
    fn reference(
        local: &[KvBuffer],
        remote: &[KvBuffer],
        src: &[i32],
        dst: &[i32],
        heads: Option<&KvHeads>,
    ) -> Vec<Request> {
        let mut breaks = vec![0];
        for i in 1..src.len() {
            if src[i] - src[i - 1] != 1 || dst[i] - dst[i - 1] != 1 {
                breaks.push(i);
            }
        }
        breaks.push(src.len());
        let mut out = Vec::new();
        for (l, r) in local.iter().zip(remote) {
            for w in breaks.windows(2) {
                let (a, b) = (w[0], w[1]);
                if a == b {
                    continue;
                }
                match heads {
                    None => out.push(Request {
                        local: (l.base + src[a] as u64 * l.page_bytes) as usize,
                        remote: r.base + dst[a] as u64 * r.page_bytes,
                        len: ((b - a) as u64 * l.page_bytes) as usize,
                    }),
                    Some(h) => {
                        let hb = h.head_bytes;
                        for i in a..b {
                            for t in 0..u64::from(h.tokens_per_page) {
                                let lt = src[i] as u64 * u64::from(h.tokens_per_page) + t;
                                let rt = dst[i] as u64 * u64::from(h.tokens_per_page) + t;
                                out.push(Request {
                                    local: (l.base + (lt * u64::from(h.local_heads) + u64::from(h.local_first)) * hb)
                                        as usize,
                                    remote: r.base + (rt * u64::from(h.remote_heads) + u64::from(h.remote_first)) * hb,
                                    len: (u64::from(h.count) * hb) as usize,
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Every request cut into `unit`-byte (local, remote) pairs, sorted: two
    /// request lists move the same bytes to the same places iff equal.
    fn units(reqs: &[Request], unit: usize) -> Vec<(usize, u64)> {
        let mut v: Vec<(usize, u64)> = reqs
            .iter()
            .flat_map(|r| {
                assert_eq!(r.len % unit, 0);
                (0..r.len / unit).map(move |k| (r.local + k * unit, r.remote + (k * unit) as u64))
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// A random page map: `pages` distinct destination pages, fragmented or
    /// with long contiguous stretches.
    fn random_map(rng: &mut fastrand::Rng, pages: usize, pool: u64, contiguous: bool) -> (Vec<i32>, Vec<i32>) {
        let mut dst: Vec<i32> = (0..pool as i32).collect();
        let mut src = dst.clone();
        if !contiguous {
            rng.shuffle(&mut dst);
            rng.shuffle(&mut src);
        } else {
            let (a, b) = (rng.u64(0..pool - pages as u64 + 1) as usize, rng.u64(0..pool - pages as u64 + 1) as usize);
            dst.rotate_left(a);
            src.rotate_left(b);
            // A few breaks in the middle.
            for _ in 0..if pages > 1 { rng.usize(0..4) } else { 0 } {
                let (i, j) = (rng.usize(0..pages), rng.usize(0..pages));
                src.swap(i, j);
            }
        }
        src.truncate(pages);
        dst.truncate(pages);
        (src, dst)
    }

    #[test]
    fn runs_match_sglang_rule_on_random_maps() {
        let mut rng = fastrand::Rng::with_seed(21);
        for round in 0..300 {
            let pool = rng.u64(1..200);
            let pages = rng.usize(0..=pool as usize);
            let (src, dst) = random_map(&mut rng, pages, pool, round % 2 == 0);
            let nb = rng.usize(1..5);
            let (local, remote) = (bufs(nb, 0x10000, PAGE, pool), bufs(nb, 0x9000_0000, PAGE, pool));
            let plan = KvPlan::new(&local, &remote, &src, &dst, None).unwrap();
            let got = plan.requests(0, nb, usize::MAX).unwrap();
            assert_eq!(got, reference(&local, &remote, &src, &dst, None), "round {round}");
            assert_eq!(plan.request_count(0, nb).unwrap(), got.len() as u64);
            assert_eq!(plan.runs().iter().map(|r| r.len).sum::<u64>(), pages as u64);
            // Sub-ranges are the matching slices of the whole.
            let per = plan.requests_per_buffer() as usize;
            for first in 0..nb {
                let part = plan.requests(first, first + 1, usize::MAX).unwrap();
                assert_eq!(part, got[first * per..(first + 1) * per]);
            }
        }
    }

    #[test]
    fn head_slices_move_what_per_token_entries_move() {
        let mut rng = fastrand::Rng::with_seed(8);
        // (local heads, remote heads, local first, remote first, count)
        let shapes =
            [(8, 2, 2, 0, 2), (2, 8, 0, 6, 2), (8, 8, 0, 0, 8), (4, 4, 1, 1, 2), (4, 1, 3, 0, 1), (1, 4, 0, 2, 1)];
        for round in 0..120 {
            let (lh, rh, lf, rf, count) = shapes[round % shapes.len()];
            let tpp = [1u32, 2, 16][round % 3];
            let hb = [2u64, 128][round % 2];
            let h = KvHeads {
                tokens_per_page: tpp,
                local_heads: lh,
                remote_heads: rh,
                local_first: lf,
                remote_first: rf,
                count,
                head_bytes: hb,
            };
            let pool = rng.u64(1..40);
            let pages = rng.usize(0..=pool as usize);
            let (src, dst) = random_map(&mut rng, pages, pool, round % 2 == 1);
            let lpb = u64::from(tpp * lh) * hb;
            let rpb = u64::from(tpp * rh) * hb;
            let (local, remote) = (bufs(2, 0x10000, lpb, pool), bufs(2, 0x7000_0000, rpb, pool));
            let plan = KvPlan::new(&local, &remote, &src, &dst, Some(&h)).unwrap();
            let got = plan.requests(0, 2, usize::MAX).unwrap();
            let want = reference(&local, &remote, &src, &dst, Some(&h));
            let unit = (u64::from(count) * hb) as usize;
            assert_eq!(units(&got, unit), units(&want, unit), "round {round}");
            if count == lh && count == rh {
                let whole = KvPlan::new(&local, &remote, &src, &dst, None).unwrap();
                assert_eq!(got, whole.requests(0, 2, usize::MAX).unwrap(), "whole tokens: no more requests");
            } else {
                assert_eq!(got, want, "one piece per token slot, in page order");
            }
        }
    }

    #[test]
    fn qwen3_8b_handoff_plans_in_runs() {
        // 36 layers x K and V, 2048 pages of 16 tokens x 8 KV heads x 128 x 2 bytes, 200 runs.
        let pages = 2048;
        let page_bytes = 16 * 8 * 128 * 2;
        let (local, remote) = (bufs(72, 0x1000, page_bytes, 4096), bufs(72, 0x1000, page_bytes, 4096));
        let src: Vec<i32> = (0..pages).map(|i| (i / 10) * 20 + i % 10 + 3).collect();
        let dst: Vec<i32> = (0..pages).collect();
        let plan = KvPlan::new(&local, &remote, &src, &dst, None).unwrap();
        assert_eq!(plan.runs().len(), 205);
        assert_eq!(plan.request_count(0, 72).unwrap(), 72 * 205);
        assert_eq!(plan.request_count(71, 72).unwrap(), 205);
    }

    fn err(r: Result<KvPlan>) -> String {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        e.message().to_owned()
    }

    #[test]
    fn bad_inputs_are_named_with_their_values() {
        let (l, r) = (bufs(2, 0x1000, PAGE, 8), bufs(2, 0x100000, PAGE, 8));
        let new =
            |l: &[KvBuffer], r: &[KvBuffer], s: &[i32], d: &[i32], h: Option<&KvHeads>| KvPlan::new(l, r, s, d, h);
        assert_eq!(err(new(&[], &[], &[], &[], None)), "buffers is 0: a plan needs at least one buffer");
        assert_eq!(err(new(&l, &r, &[0, 1], &[0], None)), "src_pages has 2 entries but dst_pages has 1");
        assert_eq!(err(new(&l, &r, &[0, -1], &[0, 1], None)), "src_pages[1] is -1, below 0");
        assert_eq!(err(new(&l, &r, &[0, 1], &[8, 1], None)), "dst_pages[0] is 8, not below remote[0].pages 8");
        let mut small = r.clone();
        small[1].pages = 4;
        assert_eq!(err(new(&l, &small, &[0, 1], &[4, 1], None)), "dst_pages[0] is 4, not below remote[1].pages 4");
        assert_eq!(
            err(new(&l, &r, &[0, 1, 2], &[3, 5, 3], None)),
            "dst_pages[2] is 3, as is dst_pages[0]: two writes to one page"
        );
        let mut zero = l.clone();
        zero[1].page_bytes = 0;
        assert_eq!(err(new(&zero, &r, &[0], &[0], None)), "local[1].page_bytes is 0");
        zero[1] = KvBuffer { base: 0, ..l[1] };
        assert_eq!(err(new(&zero, &r, &[0], &[0], None)), "local[1].base is 0");
        let mut wide = r.clone();
        wide[0] = KvBuffer { base: u64::MAX - 100, page_bytes: 16, pages: 8 };
        assert!(err(new(&l, &wide, &[0], &[0], None)).starts_with("remote[0]: base 0xffffffffffffff9b + pages 8 x"));
        wide[0] = KvBuffer { base: 1, page_bytes: 1 << 40, pages: 1 << 30 };
        assert!(err(new(&l, &wide, &[0], &[0], None)).contains("overflows 64 bits"));
        wide[0] = KvBuffer { page_bytes: 2 * PAGE, ..r[0] };
        assert!(err(new(&l, &wide, &[0], &[0], None)).starts_with("local[0].page_bytes 256 differs from remote[0]"));
        assert_eq!(err(new(&l, &r[..1], &[0], &[0], None)), "local has 2 buffers but remote has 1");

        let h = KvHeads {
            tokens_per_page: 2,
            local_heads: 4,
            remote_heads: 2,
            local_first: 2,
            remote_first: 0,
            count: 2,
            head_bytes: 32,
        };
        let (hl, hr) = (bufs(2, 0x1000, 2 * 4 * 32, 8), bufs(2, 0x100000, 2 * 2 * 32, 8));
        assert!(new(&hl, &hr, &[0], &[0], Some(&h)).is_ok());
        assert_eq!(err(new(&hl, &hr, &[0], &[0], Some(&KvHeads { count: 0, ..h }))), "heads.count is 0");
        assert_eq!(
            err(new(&hl, &hr, &[0], &[0], Some(&KvHeads { local_first: 3, ..h }))),
            "heads.local_first 3 + heads.count 2 = 5 is above heads.local_heads 4: the slice leaves the token"
        );
        assert!(err(new(&hl, &hr, &[0], &[0], Some(&KvHeads { remote_first: u32::MAX, ..h })))
            .starts_with("heads.remote_first 4294967295 + heads.count 2 = 4294967297 is above"));
        assert_eq!(
            err(new(&hl, &hl, &[0], &[0], Some(&h))),
            "remote[0].page_bytes is 256 but heads.tokens_per_page 2 x heads.remote_heads 2 x heads.head_bytes 32 = 128"
        );
        let huge = KvHeads { head_bytes: u64::MAX / 2, ..h };
        assert!(err(new(&hl, &hr, &[0], &[0], Some(&huge))).ends_with("overflows 64 bits"));
    }

    #[test]
    fn ranges_limits_and_reads_are_checked() {
        let (l, r) = (bufs(3, 0x1000, PAGE, 8), bufs(3, 0x100000, PAGE, 8));
        let plan = KvPlan::new(&l, &r, &[0, 1, 5, 1], &[0, 1, 2, 3], None).unwrap();
        assert_eq!(plan.request_count(0, 3).unwrap(), 9);
        let e = plan.request_count(2, 2).unwrap_err();
        assert_eq!(e.message(), "first_buffer 2 is not below end_buffer 2");
        assert_eq!(plan.request_count(1, 4).unwrap_err().message(), "end_buffer 4 is past the plan's 3 buffers");
        assert!(plan.requests(0, 3, 8).unwrap_err().message().contains("9 requests, over the limit of 8"));
        assert_eq!(
            plan.check_readable().unwrap_err().message(),
            "a READ would write local page 1 twice (src_pages[1] and src_pages[3])"
        );
        let empty = KvPlan::new(&l, &r, &[], &[], None).unwrap();
        assert_eq!(empty.request_count(0, 3).unwrap(), 0);
        assert!(empty.requests(0, 3, 0).unwrap().is_empty());
        assert!(empty.check_readable().is_ok());
    }
}
