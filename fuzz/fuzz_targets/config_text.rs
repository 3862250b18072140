//! Text that reaches the configuration layer through the ABI: argv, IB
//! device configurations (inline JSON), session names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdx::config::{args::ServerArgs, argv, ib_device, net};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let words: Vec<&str> = text.split(' ').collect();
    let mut args = ServerArgs::default();
    let _ = argv::parse_argv(&mut args, &words);
    if !text.ends_with(".json") {
        let _ = ib_device::parse_ib_device_config(Some(text));
        let _ = ib_device::get_ib_devices_for_gpu(Some(text), 0);
    }
    let _ = net::session_id(text, 1);
});
