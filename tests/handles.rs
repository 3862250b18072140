//! Handle slots are reused: 100k create/free cycles of every cheap handle
//! type leave the resident set where it was (the table neither grows nor
//! keeps freed objects), while each freed handle stays refused.

use std::ptr;

use pdx::ffi::args::{pdx_args, pdx_args_free, pdx_args_new, pdx_normalize_args};
use pdx::ffi::status::{PDX_ERR_INVALID_HANDLE, PDX_OK};
use pdx::ffi::transport::{pdx_resolve_transport, pdx_transport_choice, pdx_transport_choice_free};

fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

#[test]
fn rss_stays_flat_over_100k_create_free_cycles() {
    let cycle = || unsafe {
        let mut a: *mut pdx_args = ptr::null_mut();
        assert_eq!(pdx_args_new(&mut a), PDX_OK);
        pdx_args_free(a);
        assert_eq!(pdx_normalize_args(a), PDX_ERR_INVALID_HANDLE);
        let mut c: *mut pdx_transport_choice = ptr::null_mut();
        assert_eq!(pdx_resolve_transport(c"127.0.0.1".as_ptr(), c"tcp".as_ptr(), ptr::null(), -1, &mut c), PDX_OK);
        pdx_transport_choice_free(c);
    };
    // Warm up allocator arenas and the tables' first slots.
    for _ in 0..1000 {
        cycle();
    }
    let before = rss_kib();
    for _ in 0..100_000 {
        cycle();
    }
    let grown = rss_kib().saturating_sub(before);
    println!("RSS grew {grown} KiB over 100k create/free cycles");
    assert!(grown < 4096, "RSS grew {grown} KiB over 100k cycles");
}
