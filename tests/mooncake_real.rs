//! Against a real Mooncake library: two engines on the tcp protocol in one
//! process, a write and a read back, bytes verified.
//!
//! Runs the transfer when the library `PDX_MOONCAKE_LIB` names (default
//! `libtransfer_engine.so`) is a build of Mooncake's transfer engine with its
//! C API. Otherwise it checks that pdx reports the backend unavailable with
//! that same cause, and prints that the transfer was skipped. (The PyPI
//! wheel's engine does not export the C API.)

use std::sync::Arc;

use pdx::mooncake::MooncakeBackend;
use pdx::transfer::TransferBackend;
use pdx::transfer::{Direction, Request};

fn real_library() -> Option<Arc<mooncake_sys::Api>> {
    let path = std::env::var("PDX_MOONCAKE_LIB").unwrap_or_else(|_| mooncake_sys::DEFAULT_LIB.to_owned());
    match mooncake_sys::load_cached(&path) {
        Ok(api) => {
            assert_eq!(pdx::backend::unavailable_reason("mooncake"), None, "the library loads: mooncake is available");
            Some(api)
        }
        Err(e) => {
            // No usable library: the backend table says so, naming it.
            let why = pdx::backend::unavailable_reason("mooncake").expect("mooncake is reported unavailable");
            assert!(why.contains(&path) && why.contains(&e.to_string()), "{why}");
            eprintln!("SKIPPED the transfer of mooncake_real: {why}");
            None
        }
    }
}

#[test]
fn two_engines_tcp_write_and_read_back() {
    let Some(api) = real_library() else { return };
    let a = MooncakeBackend::start_with(api.clone(), "tcp", "127.0.0.1", "").expect("engine a");
    let b = MooncakeBackend::start_with(api, "tcp", "127.0.0.1", "").expect("engine b");
    assert_eq!(a.protocol(), "tcp");
    assert!(b.session_id().starts_with("127.0.0.1:"), "{}", b.session_id());

    let src: Vec<u8> = (0..1 << 16).map(|i| (i * 31 + 7) as u8).collect();
    let mut back = vec![0u8; src.len()];
    let mut remote = vec![0u8; src.len()];
    a.register_batch(&[(src.as_ptr() as u64, src.len() as u64), (back.as_mut_ptr() as u64, back.len() as u64)])
        .expect("register on a");
    b.register_batch(&[(remote.as_mut_ptr() as u64, remote.len() as u64)]).expect("register on b");

    let write = Request { local: src.as_ptr() as usize, remote: remote.as_ptr() as u64, len: src.len() };
    // SAFETY: the buffers outlive the calls.
    unsafe { a.transfer_sync(b.session_id(), Direction::Write, vec![write]) }.expect("write");
    assert!(remote == src, "bytes written to b differ");

    let read = Request { local: back.as_mut_ptr() as usize, remote: remote.as_ptr() as u64, len: back.len() };
    // SAFETY: as above.
    unsafe { a.transfer_sync(b.session_id(), Direction::Read, vec![read]) }.expect("read");
    assert!(back == src, "bytes read back differ");

    a.unregister_batch(&[src.as_ptr() as u64, back.as_ptr() as u64]).expect("unregister a");
    b.unregister_batch(&[remote.as_ptr() as u64]).expect("unregister b");
    a.stop();
    b.stop();
}
