//! A handshake frame as a peer sends it: length prefix, type, JSON body, and
//! the descriptor and notification parsers on the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdx::engine::{descriptor, notify, wire};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let prefix: [u8; 8] = data[..8].try_into().unwrap();
    if let Ok(n) = wire::check_frame_length(prefix, 1 << 20) {
        let body = &data[8..data.len().min(8 + n)];
        let (_, json) = wire::split_frame_body(body);
        let _ = descriptor::parse_descriptor(json, "peer:1", "peer");
        let _ = notify::decode(json);
    }
    let _ = descriptor::parse_descriptor(data, "peer:1", "peer");
});
