//! Page-aligned, pre-faulted anonymous memory for transfer buffers, so page
//! faults do not pollute the measurements; optionally on huge pages
//! (`--huge`), to see what they change for cross-process copies.

use clap::ValueEnum;
use memmap2::{Advice, MmapMut, MmapOptions};

/// Size of the huge pages asked for (x86-64 and arm64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// What pages back a buffer.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug, Default)]
pub enum Pages {
    /// Base pages (4 KiB), the default.
    #[default]
    Normal,
    /// Transparent huge pages: a 2 MiB-aligned mapping with
    /// madvise(MADV_HUGEPAGE), then faulted in (needs THP `enabled` at
    /// `madvise` or `always`).
    Thp,
    /// MAP_HUGETLB: pages from the reserved pool (vm.nr_hugepages).
    Hugetlb,
}

impl Pages {
    pub fn name(self) -> &'static str {
        match self {
            Pages::Normal => "normal",
            Pages::Thp => "thp",
            Pages::Hugetlb => "hugetlb",
        }
    }
}

/// An anonymous mapping (populated up front), unmapped on drop.
pub struct Buffer {
    map: MmapMut,
    /// Start of the buffer in `map` (huge-page alignment for THP).
    offset: usize,
    len: usize,
    pages: Pages,
}

impl Buffer {
    pub fn with_pages(len: usize, pages: Pages) -> std::io::Result<Buffer> {
        let len = len.max(1);
        match pages {
            Pages::Normal => {
                Ok(Buffer { map: MmapOptions::new().len(len).populate().map_anon()?, offset: 0, len, pages })
            }
            Pages::Thp => {
                // THP backs only whole aligned 2 MiB ranges: map a page more
                // and start at the first boundary. Faulting after the advice
                // (not MAP_POPULATE) lets the kernel allocate huge pages directly.
                // Advising the buffer alone keeps it a mapping of its own (the
                // kernel merges neighbours with equal flags), which smaps reports.
                let mut map = MmapOptions::new().len(len + HUGE_PAGE).map_anon()?;
                let offset = map.as_ptr().align_offset(HUGE_PAGE);
                map.advise_range(Advice::HugePage, offset, len)?;
                for page in map[offset..offset + len].chunks_mut(4096) {
                    page[0] = 0;
                }
                Ok(Buffer { map, offset, len, pages })
            }
            Pages::Hugetlb => {
                let rounded = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
                let map = MmapOptions::new().len(rounded).huge(Some(21)).populate().map_anon().map_err(|e| {
                    let reserved = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap_or_default();
                    std::io::Error::new(
                        e.kind(),
                        format!(
                            "MAP_HUGETLB of {rounded} bytes: {e} (vm.nr_hugepages is {}; reserve enough 2 MiB pages \
                             first)",
                            reserved.trim()
                        ),
                    )
                })?;
                Ok(Buffer { map, offset: 0, len, pages })
            }
        }
    }

    pub fn addr(&self) -> u64 {
        self.as_slice().as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map[self.offset..self.offset + self.len]
    }

    /// Bytes of this buffer the kernel backs with huge pages now (from
    /// `/proc/self/smaps`; `None` where it cannot say).
    pub fn huge_bytes(&self) -> Option<u64> {
        if self.pages == Pages::Hugetlb {
            return Some(self.len as u64);
        }
        // The mapping (VMA) that holds the buffer; it may take in neighbours
        // the kernel merged it with, which is fine for a report.
        let at = self.addr();
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut in_ours = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if !first.ends_with(':') {
                if let Some((lo, hi)) = first.split_once('-') {
                    let (lo, hi) = (u64::from_str_radix(lo, 16).ok()?, u64::from_str_radix(hi, 16).ok()?);
                    in_ours = (lo..hi).contains(&at);
                    continue;
                }
            }
            if in_ours {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    let bytes = kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024;
                    return Some(bytes.min(self.len as u64));
                }
            }
        }
        None
    }

    /// "thp, 256 MiB of 256 MiB on huge pages" and the like.
    pub fn describe(&self) -> String {
        let huge = self.huge_bytes().map_or("unknown".to_owned(), |b| crate::report::human_bytes(b as usize));
        format!("{} pages, {huge} of {} on huge pages", self.pages.name(), crate::report::human_bytes(self.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_of_each_kind_are_usable() {
        for pages in [Pages::Normal, Pages::Thp] {
            let mut b = Buffer::with_pages(3 << 20, pages).unwrap();
            assert_eq!(b.len(), 3 << 20);
            b.as_mut_slice()[(3 << 20) - 1] = 7;
            assert_eq!(b.as_slice()[(3 << 20) - 1], 7);
            assert!(b.huge_bytes().is_some(), "{pages:?}");
        }
        let thp = Buffer::with_pages(4 << 20, Pages::Thp).unwrap();
        assert_eq!(thp.addr() % HUGE_PAGE as u64, 0);
    }
}
