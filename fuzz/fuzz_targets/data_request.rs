//! A data-port request header against a set of registered regions: the
//! check every inbound request passes before memory is touched.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdx::engine::wire::RequestHeader;
use pdx::transfer::regions::RegionMap;

const HEADER_LEN: usize = 24;

fuzz_target!(|data: &[u8]| {
    if data.len() < HEADER_LEN {
        return;
    }
    let header = RequestHeader::decode(data[..HEADER_LEN].try_into().unwrap());
    assert_eq!(RequestHeader::decode(&header.encode()), header);
    // The rest of the input describes regions to register.
    let mut regions = RegionMap::default();
    for chunk in data[HEADER_LEN..].chunks_exact(16) {
        let addr = u64::from_le_bytes(chunk[..8].try_into().unwrap());
        let len = u64::from_le_bytes(chunk[8..].try_into().unwrap()) % (1 << 40);
        let _ = regions.insert_all(&[(addr, len)], |_, _| ());
    }
    if let Some((start, len, _)) = regions.containing(header.addr, header.size) {
        // A hit must contain the whole range, without wrapping.
        let end = header.addr.checked_add(header.size).expect("lookup accepted a wrapping range");
        assert!(header.size > 0 && header.addr >= start && end <= start + len);
    }
});
