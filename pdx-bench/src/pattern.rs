//! Deterministic test data and a fast checksum, so both sides of a
//! benchmark can verify every byte without shipping the data around.

/// Fill `buf` with the pattern of `seed`; byte `i` depends only on
/// `(seed, i)`, so any sub-range can be checked on its own.
pub fn fill(buf: &mut [u8], seed: u64) {
    fill_at(buf, seed, 0);
}

/// Fill `buf` with bytes `start..start+len` of the pattern of `seed`
/// (`start` a multiple of 8).
pub fn fill_at(buf: &mut [u8], seed: u64, start: usize) {
    debug_assert_eq!(start % 8, 0);
    let first = (start / 8) as u64;
    let words = buf.len() / 8;
    let (head, tail) = buf.split_at_mut(words * 8);
    for (i, chunk) in head.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(seed, first + i as u64).to_le_bytes());
    }
    let last = word(seed, first + words as u64).to_le_bytes();
    tail.copy_from_slice(&last[..tail.len()]);
}

/// Whether `buf` equals bytes `start..` of the pattern of `seed`.
pub fn matches_at(buf: &[u8], seed: u64, start: usize) -> bool {
    let mut expected = vec![0u8; (4 << 20).min(buf.len())];
    buf.chunks(expected.len().max(1)).enumerate().all(|(i, chunk)| {
        let e = &mut expected[..chunk.len()];
        fill_at(e, seed, start + i * (4 << 20));
        e == chunk
    })
}

#[inline]
fn word(seed: u64, i: u64) -> u64 {
    // splitmix64 of (seed, index)
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A 64-bit checksum of `buf` (XXH3: position dependent, and fast enough
/// to verify a gigabyte after every run).
pub fn checksum(buf: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_self_describing() {
        let mut a = vec![0u8; 1001];
        fill(&mut a, 9);
        let mut b = vec![0u8; 1001];
        fill(&mut b, 9);
        assert_eq!(checksum(&a), checksum(&b));
        b[500] ^= 1;
        assert_ne!(checksum(&a), checksum(&b));
        let mut c = vec![0u8; 1001];
        fill(&mut c, 10);
        assert_ne!(checksum(&a), checksum(&c));
        let mut d = vec![0u8; 200];
        fill_at(&mut d, 9, 800);
        assert_eq!(&d[..], &a[800..1000]);
        assert!(matches_at(&a[808..], 9, 808));
        assert!(!matches_at(&a[808..], 9, 816));
    }
}
