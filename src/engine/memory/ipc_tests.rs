//! Tests of CUDA IPC against the driver stand-in (c_tests/cuda_double, compiled here):
//! what one process can show, and copies with a second process (this
//! test binary again, running `importer_process`).
use super::*;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Length of the exported allocation (odd: its last page is partly used).
const LEN: usize = (1 << 20) + 333;
const PULL_AT: u64 = 4093;
const PULL_LEN: usize = 70_001;
const PUSH_HOST_AT: u64 = 200_000;
const PUSH_HOST_LEN: usize = 12_345;
const PUSH_DEV_AT: u64 = LEN as u64 - 3000;
const PUSH_DEV_LEN: usize = 3000;
const CHILD_ARG: &str = "pdx-ipc-importer=";

/// The stand-in and the driver API loaded from it, or `None` (printed)
/// where no C compiler builds it.
fn stand_in() -> Option<(PathBuf, Arc<Api>)> {
    static BUILT: OnceLock<Option<PathBuf>> = OnceLock::new();
    let path = BUILT.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("c_tests/cuda_double/cuda_double.c");
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::fs::read(&source).ok()?.hash(&mut hasher);
        // One build per version of the source, kept and shared by runs.
        let lib = std::env::temp_dir().join(format!("pdx-cuda-double-{:016x}.so", hasher.finish()));
        if lib.exists() {
            return Some(lib);
        }
        let partial = lib.with_extension(format!("{}.tmp", std::process::id()));
        let built = std::process::Command::new("cc")
            .args(["-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o"])
            .arg(&partial)
            .arg(&source)
            .arg("-lpthread")
            .status();
        let renamed = matches!(built, Ok(s) if s.success()) && std::fs::rename(&partial, &lib).is_ok();
        std::fs::remove_file(&partial).ok();
        renamed.then_some(lib)
    });
    let Some(path) = path.clone() else {
        println!("SKIP: no C compiler to build the CUDA driver stand-in");
        return None;
    };
    Some((path.clone(), cuda_sys::load_cached(path.to_str().unwrap()).unwrap()))
}

/// The stand-in's counters and injection are process-wide: its tests
/// take turns.
fn serial() -> parking_lot::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = parking_lot::const_mutex(());
    SERIAL.lock()
}

fn symbol<T: Copy>(path: &std::path::Path, name: &str) -> T {
    let lib = CString::new(path.to_str().unwrap()).unwrap();
    let name = CString::new(name).unwrap();
    // SAFETY: the library is loaded already (this only takes a
    // reference); the symbol is read with its C declaration's type.
    unsafe {
        let handle = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!handle.is_null());
        let sym = libc::dlsym(handle, name.as_ptr());
        assert!(!sym.is_null(), "{name:?}");
        std::mem::transmute_copy::<*mut c_void, T>(&sym)
    }
}

/// `cuda_double_stats` fields this module cares about.
#[derive(Debug, Default, PartialEq, Eq)]
struct IpcStats {
    d2d: u64,
    exports: u64,
    opens: u64,
    closes: u64,
    mapped: u64,
}

fn ipc_stats(path: &std::path::Path) -> IpcStats {
    let f: unsafe extern "C" fn(*mut [u64; 29]) = symbol(path, "cuda_double_stats");
    let mut s = [0u64; 29];
    // SAFETY: struct cuda_double_stats is 29 u64 (c_tests/cuda_double/cuda_double.h).
    unsafe { f(&mut s) };
    IpcStats { d2d: s[24], exports: s[25], opens: s[26], closes: s[27], mapped: s[28] }
}

fn inject(path: &std::path::Path, what: &str, after: c_int, count: c_int, code: c_int) {
    let f: unsafe extern "C" fn(*const c_char, c_int, c_int, c_int) = symbol(path, "cuda_double_inject");
    let what = CString::new(what).unwrap();
    // SAFETY: a NUL-terminated name the stand-in copies.
    unsafe { f(what.as_ptr(), after, count, code) };
}

/// Device memory of the test's own, filled and read through the driver.
struct Mem<'a> {
    device: &'a Device,
    ptr: u64,
    len: usize,
}

impl<'a> Mem<'a> {
    fn new(device: &'a Device, len: usize) -> Mem<'a> {
        let _current = Current::make(device).unwrap();
        let mut ptr = 0;
        // SAFETY: the context is current; the driver writes one address.
        let rc = unsafe { (device.api.mem_alloc.unwrap())(&mut ptr, len) };
        device.api.check(rc, "cuMemAlloc_v2").unwrap();
        Mem { device, ptr, len }
    }

    fn write(&self, off: u64, bytes: &[u8]) {
        let api = &self.device.api;
        let _current = Current::make(self.device).unwrap();
        // SAFETY: in the allocation (the tests' own arithmetic); synchronized before `bytes` goes.
        unsafe {
            let rc = (api.memcpy_htod_async)(self.ptr + off, bytes.as_ptr().cast(), bytes.len(), std::ptr::null_mut());
            api.check(rc, "cuMemcpyHtoDAsync_v2").unwrap();
            api.check((api.stream_synchronize)(std::ptr::null_mut()), "cuStreamSynchronize").unwrap();
        }
    }

    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let api = &self.device.api;
        let _current = Current::make(self.device).unwrap();
        let mut out = vec![0u8; len];
        // SAFETY: as in `write`, the other way.
        unsafe {
            let rc = (api.memcpy_dtoh_async)(out.as_mut_ptr().cast(), self.ptr + off, len, std::ptr::null_mut());
            api.check(rc, "cuMemcpyDtoHAsync_v2").unwrap();
            api.check((api.stream_synchronize)(std::ptr::null_mut()), "cuStreamSynchronize").unwrap();
        }
        out
    }
}

impl Drop for Mem<'_> {
    fn drop(&mut self) {
        let _current = Current::make(self.device).unwrap();
        // SAFETY: an allocation of ours no copy uses any more.
        let _ = unsafe { (self.device.api.mem_free.unwrap())(self.ptr) };
    }
}

// Safe forms of the copies for the tests: the local side is a live
// slice, or `n` bytes of a `Mem` (checked against its length).
fn pull_host(imports: &PeerImports, device: &Arc<Device>, dst: &mut [u8], from: &DeviceExport) -> Result<()> {
    // SAFETY: `dst` is writable for its whole length during the call.
    unsafe { imports.pull(device, Local::Host(dst.as_mut_ptr()), from, dst.len() as u64) }
}

fn push_host(imports: &PeerImports, device: &Arc<Device>, src: &[u8], to: &DeviceExport) -> Result<()> {
    // SAFETY: `src` is readable for its whole length; it is only read.
    unsafe { imports.push(device, Local::Host(src.as_ptr().cast_mut()), to, src.len() as u64) }
}

fn pull_dev(imports: &PeerImports, device: &Arc<Device>, dst: &Mem<'_>, from: &DeviceExport, n: usize) -> Result<()> {
    assert!(n <= dst.len);
    // SAFETY: `n` bytes of an allocation of ours on `device`, which no other copy uses.
    unsafe { imports.pull(device, Local::Device(dst.ptr), from, n as u64) }
}

fn push_dev(imports: &PeerImports, device: &Arc<Device>, src: &Mem<'_>, to: &DeviceExport, n: usize) -> Result<()> {
    assert!(n <= src.len);
    // SAFETY: as in `pull_dev`.
    unsafe { imports.push(device, Local::Device(src.ptr), to, n as u64) }
}

fn pattern(seed: u8, from: usize, len: usize) -> Vec<u8> {
    (from..from + len).map(|i| seed.wrapping_mul(131).wrapping_add((i * 7 + (i >> 9)) as u8)).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> [u8; HANDLE_LEN] {
    let mut out = [0u8; HANDLE_LEN];
    assert_eq!(s.len(), 2 * HANDLE_LEN);
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

#[test]
fn exports_name_the_allocation_and_the_offset_and_are_cached_per_base() {
    let Some((path, api)) = stand_in() else { return };
    let _serial = serial();
    let device = super::super::cuda::device(&api, 0).unwrap();
    let mem = Mem::new(&device, LEN);
    let exports = Exports::new();
    let before = ipc_stats(&path);
    let whole = exports.export(&device, mem.ptr, LEN as u64).unwrap();
    let inner = exports.export(&device, mem.ptr + 100, 50).unwrap();
    assert_eq!((whole.offset, inner.offset), (0, 100));
    assert_eq!(whole.handle, inner.handle);
    assert_eq!(&whole.handle[..8], b"cudadbl1");
    assert_eq!(ipc_stats(&path).exports - before.exports, 1, "the driver is asked once per allocation");
    assert_eq!(exports.len(), 1);
    // A range past the allocation's end, and memory that is not the driver's.
    let e = exports.export(&device, mem.ptr + LEN as u64 - 10, 11).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("runs past the end of its device allocation"), "{e}");
    let host = [0u8; 64];
    let e = exports.export(&device, host.as_ptr() as u64, 64).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("not in device memory"), "{e}");
    // Forgotten at unregister: the driver is asked again, and its
    // failure is reported with the call and the code.
    exports.forget(mem.ptr + 5, 1);
    assert!(exports.is_empty());
    inject(&path, "cuIpcGetMemHandle", 0, 1, cuda_sys::CUDA_ERROR_INVALID_VALUE);
    let e = exports.export(&device, mem.ptr, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Device);
    assert!(e.message().contains("cuIpcGetMemHandle failed: CUDA_ERROR_INVALID_VALUE"), "{e}");
    assert_eq!(exports.export(&device, mem.ptr, 1).unwrap().handle, whole.handle);
    // forget() leaves other allocations alone.
    exports.forget(mem.ptr + LEN as u64 + (1 << 30), 10);
    assert_eq!(exports.len(), 1);
}

#[test]
fn a_handle_is_not_opened_in_the_process_that_exported_it() {
    let Some((path, api)) = stand_in() else { return };
    let _serial = serial();
    let device = super::super::cuda::device(&api, 0).unwrap();
    let mem = Mem::new(&device, 4096);
    let export = Exports::new().export(&device, mem.ptr, 4096).unwrap();
    let imports = PeerImports::new("this very process");
    let mut buf = [0u8; 16];
    let e = pull_host(&imports, &device, &mut buf, &export).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Device);
    assert!(e.message().contains("CUDA_ERROR_INVALID_CONTEXT"), "{e}");
    assert!(e.message().contains("peer this very process"), "{e}");
    assert_eq!(imports.open_count(), 0);
    assert_eq!(ipc_stats(&path).mapped, 0);
    // Nothing to copy opens nothing.
    pull_host(&imports, &device, &mut buf[..0], &export).unwrap();
    assert_eq!(imports.open_count(), 0);
}

#[test]
fn a_driver_without_ipc_is_named_as_unavailable() {
    let Some((path, _)) = stand_in() else { return };
    let mut api = Api::load(path.to_str().unwrap()).unwrap();
    check_usable(&api).unwrap();
    api.ipc_open_mem_handle = None;
    let e = check_usable(&api).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DeviceUnavailable);
    assert!(e.message().contains("has no cuIpcOpenMemHandle_v2: CUDA IPC is not available"), "{e}");
}

/// A second process opens this one's device memory and copies both
/// ways, device and host memory on its side (see `importer_process`);
/// what it pushed is here once it returns, since every copy is
/// synchronized before `push` returns.
#[test]
fn pull_and_push_reach_another_process() {
    let Some((path, api)) = stand_in() else { return };
    let _serial = serial();
    let device = super::super::cuda::device(&api, 0).unwrap();
    let mem = Mem::new(&device, LEN);
    let other = Mem::new(&device, 8192);
    mem.write(0, &pattern(1, 0, LEN));
    other.write(0, &pattern(9, 0, 8192));
    let exports = Exports::new();
    let a = exports.export(&device, mem.ptr + 7, 1).unwrap();
    let b = exports.export(&device, other.ptr, 8192).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "engine::memory::ipc::tests::importer_process", "--ignored", "--nocapture"])
        .arg(format!("{CHILD_ARG}{}={}={}", path.display(), hex(&a.handle), hex(&b.handle)))
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the importer failed:\n{said}");
    assert!(said.contains("importer: done"), "the importer did not run:\n{said}");
    let now = mem.read(0, LEN);
    let mut want = pattern(1, 0, LEN);
    let host_at = PUSH_HOST_AT as usize;
    want[host_at..host_at + PUSH_HOST_LEN].copy_from_slice(&pattern(2, host_at, PUSH_HOST_LEN));
    let dev_at = PUSH_DEV_AT as usize;
    want[dev_at..dev_at + PUSH_DEV_LEN].copy_from_slice(&pattern(3, dev_at, PUSH_DEV_LEN));
    assert!(now == want, "the bytes the importer pushed are not (only) where it pushed them");
    assert_eq!(other.read(0, 8192), pattern(9, 0, 8192));
}

/// The importer of `pull_and_push_reach_another_process`, in a process
/// of its own; run alone it has nothing to do.
#[test]
#[ignore = "run by pull_and_push_reach_another_process in a process of its own"]
fn importer_process() {
    let Some(arg) = std::env::args().find_map(|a| a.strip_prefix(CHILD_ARG).map(str::to_owned)) else { return };
    let parts: Vec<&str> = arg.split('=').collect();
    let (path, a, b) = (PathBuf::from(parts[0]), unhex(parts[1]), unhex(parts[2]));
    let api = cuda_sys::load_cached(path.to_str().unwrap()).unwrap();
    let device = super::super::cuda::device(&api, 1).unwrap(); // another ordinal than the exporter's
    let at = |handle, offset| DeviceExport { handle, offset };
    let imports = PeerImports::new("the exporter");
    let mine = Mem::new(&device, LEN);

    // Device ← peer: all of it, then a part into host memory.
    pull_dev(&imports, &device, &mine, &at(a, 0), LEN).unwrap();
    assert!(mine.read(0, LEN) == pattern(1, 0, LEN));
    let mut host = vec![0u8; PULL_LEN];
    pull_host(&imports, &device, &mut host, &at(a, PULL_AT)).unwrap();
    assert!(host == pattern(1, PULL_AT as usize, PULL_LEN));
    assert_eq!(imports.open_count(), 1);
    let s = ipc_stats(&path);
    assert_eq!((s.opens, s.mapped, s.d2d), (1, 1, 1), "{s:?}");

    // Peer ← host memory, and peer ← device memory.
    push_host(&imports, &device, &pattern(2, PUSH_HOST_AT as usize, PUSH_HOST_LEN), &at(a, PUSH_HOST_AT)).unwrap();
    mine.write(0, &pattern(3, PUSH_DEV_AT as usize, PUSH_DEV_LEN));
    push_dev(&imports, &device, &mine, &at(a, PUSH_DEV_AT), PUSH_DEV_LEN).unwrap();

    // A range past the end of the peer's allocation copies nothing.
    let e = push_dev(&imports, &device, &mine, &at(a, LEN as u64 - 1), 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("run past the end of peer the exporter's"), "{e}");
    let e = pull_dev(&imports, &device, &mine, &at(a, u64::MAX), 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // A handle that names nothing is the driver's refusal, and opens nothing.
    let mut bogus = a;
    bogus[0] ^= 1;
    let e = pull_dev(&imports, &device, &mine, &at(bogus, 0), 1).unwrap_err();
    assert!(e.message().contains("cuIpcOpenMemHandle_v2 failed: CUDA_ERROR_INVALID_VALUE"), "{e}");
    assert_eq!(imports.open_count(), 1);

    // A batch: scattered pages, one stream, one synchronize.
    mine.write(0, &[0u8; 8 * 4096]);
    let page_at = |i: u64| (7 - i) * 4096 + 5;
    let pages: Vec<DeviceCopy> = (0..8)
        .map(|i| DeviceCopy {
            way: Way::Pull,
            local: Local::Device(mine.ptr + i * 4096),
            remote: at(a, page_at(i)),
            len: 4096,
        })
        .collect();
    // SAFETY: eight pages inside `mine` (LEN bytes), which nothing else uses.
    unsafe { imports.copy(&device, &pages) }.unwrap();
    for i in 0..8 {
        assert!(mine.read(i * 4096, 4096) == pattern(1, page_at(i) as usize, 4096), "page {i}");
    }
    // With one range refused, no copy of the batch runs (the exporter
    // checks that its bytes at PUSH_HOST_AT are still the earlier push's).
    let junk = [0xEEu8; 16];
    let refused = [
        DeviceCopy {
            way: Way::Push,
            local: Local::Host(junk.as_ptr().cast_mut()),
            remote: at(a, PUSH_HOST_AT),
            len: 16,
        },
        DeviceCopy { way: Way::Pull, local: Local::Device(mine.ptr), remote: at(a, LEN as u64 - 1), len: 2 },
    ];
    // SAFETY: `junk` is only read; 2 bytes of `mine`.
    let e = unsafe { imports.copy(&device, &refused) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");

    // Closed on request; a later copy opens it again.
    assert_eq!(imports.close(&a).unwrap(), 1);
    assert_eq!(imports.close(&a).unwrap(), 0);
    assert_eq!(ipc_stats(&path).mapped, 0);
    pull_host(&imports, &device, &mut host[..16], &at(a, 0)).unwrap();
    assert!(host[..16] == pattern(1, 0, 16));
    drop(imports);
    let s = ipc_stats(&path);
    assert_eq!((s.opens, s.closes, s.mapped), (2, 2, 0), "dropped with the peer: {s:?}");

    // At most `max_open` allocations of one peer stay open: the least
    // recently used is closed for a new one.
    let bounded = PeerImports::with_limit("the exporter", 1);
    pull_host(&bounded, &device, &mut host[..8], &at(a, 0)).unwrap();
    pull_host(&bounded, &device, &mut host[..8], &at(b, 100)).unwrap();
    assert!(host[..8] == pattern(9, 100, 8));
    assert_eq!((bounded.open_count(), ipc_stats(&path).mapped), (1, 1));
    drop(bounded);
    assert_eq!(ipc_stats(&path).mapped, 0);
    println!("importer: done");
}
