//! Opening the CUDA driver library at run time and resolving its entry
//! points once.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use libloading::Library;

use crate::types::*;

/// The driver's soname, the library to load when the caller names none.
pub const DEFAULT_LIB: &str = "libcuda.so.1";

/// Why the driver library could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` failed (no driver installed, wrong path). `reason` is the
    /// loader's own text.
    Open { path: String, reason: String },
    /// The library loaded but lacks a required entry point.
    MissingSymbol { path: String, symbol: &'static str, reason: String },
    /// The library loaded but `cuInit(0)` failed.
    Init { path: String, error: CudaError },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Open { path, reason } => {
                write!(f, "cannot load the CUDA driver library '{path}': {reason}")
            }
            LoadError::MissingSymbol { path, symbol, reason } => {
                write!(f, "CUDA driver library '{path}' does not export '{symbol}' ({reason}); it is not a CUDA driver")
            }
            LoadError::Init { path, error } => write!(f, "CUDA driver '{path}': {error}"),
        }
    }
}

impl std::error::Error for LoadError {}

/// A failed driver call: which call, the code, and the driver's own name
/// and description of it (`CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory
/// access was encountered`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    pub call: &'static str,
    pub code: CUresult,
    pub name: String,
    pub text: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}: {}", self.call, self.name, self.text)
    }
}

impl std::error::Error for CudaError {}

macro_rules! api {
    (
        required { $($field:ident = $sym:literal : fn($($arg:ty),*) -> CUresult;)* }
        optional { $($ofield:ident = $osym:literal : fn($($oarg:ty),*) -> CUresult;)* }
    ) => {
        /// The driver's entry points, each resolved once. Function pointers
        /// stay valid as long as this value lives (it owns the library).
        ///
        /// Calling them is `unsafe`: the driver checks little, so callers
        /// pass valid pointers, streams and contexts it handed out.
        pub struct Api {
            path: String,
            $(pub $field: unsafe extern "C" fn($($arg),*) -> CUresult,)*
            $(pub $ofield: Option<unsafe extern "C" fn($($oarg),*) -> CUresult>,)*
            _lib: Library,
        }

        /// The entry points every usable driver must export.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$($sym),*];

        impl Api {
            /// Open `path`, resolve every entry point and call `cuInit(0)`.
            pub fn load(path: &str) -> Result<Api, LoadError> {
                // dlopen("") would hand back the running program itself.
                if path.is_empty() {
                    return Err(LoadError::Open { path: String::new(), reason: "the path is empty".to_owned() });
                }
                // SAFETY: loading runs the library's initializers; that is the
                // point of loading the driver and cannot be checked from here.
                let lib = unsafe { Library::new(path) }
                    .map_err(|e| LoadError::Open { path: path.to_owned(), reason: e.to_string() })?;
                // SAFETY: each symbol is read with the type of its documented
                // C declaration in cuda.h.
                let api = unsafe {
                    $(
                        let $field = *lib
                            .get::<unsafe extern "C" fn($($arg),*) -> CUresult>(concat!($sym, "\0").as_bytes())
                            .map_err(|e| LoadError::MissingSymbol { path: path.to_owned(), symbol: $sym, reason: e.to_string() })?;
                    )*
                    $(
                        let $ofield = lib
                            .get::<unsafe extern "C" fn($($oarg),*) -> CUresult>(concat!($osym, "\0").as_bytes())
                            .ok()
                            .map(|s| *s);
                    )*
                    Api { path: path.to_owned(), $($field,)* $($ofield,)* _lib: lib }
                };
                // SAFETY: cuInit takes a flags word that must be 0.
                api.check(unsafe { (api.init)(0) }, "cuInit")
                    .map_err(|error| LoadError::Init { path: path.to_owned(), error })?;
                Ok(api)
            }
        }
    };
}

api! {
    required {
        init = "cuInit": fn(c_uint) -> CUresult;
        driver_get_version = "cuDriverGetVersion": fn(*mut c_int) -> CUresult;
        device_get_count = "cuDeviceGetCount": fn(*mut c_int) -> CUresult;
        device_get = "cuDeviceGet": fn(*mut CUdevice, c_int) -> CUresult;
        primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut CUcontext, CUdevice) -> CUresult;
        primary_ctx_release = "cuDevicePrimaryCtxRelease_v2": fn(CUdevice) -> CUresult;
        ctx_set_current = "cuCtxSetCurrent": fn(CUcontext) -> CUresult;
        ctx_get_current = "cuCtxGetCurrent": fn(*mut CUcontext) -> CUresult;
        pointer_get_attribute = "cuPointerGetAttribute": fn(*mut c_void, CUpointerAttribute, CUdeviceptr) -> CUresult;
        mem_host_alloc = "cuMemHostAlloc": fn(*mut *mut c_void, usize, c_uint) -> CUresult;
        mem_free_host = "cuMemFreeHost": fn(*mut c_void) -> CUresult;
        memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult;
        memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2": fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult;
        stream_create = "cuStreamCreate": fn(*mut CUstream, c_uint) -> CUresult;
        stream_destroy = "cuStreamDestroy_v2": fn(CUstream) -> CUresult;
        stream_synchronize = "cuStreamSynchronize": fn(CUstream) -> CUresult;
        get_error_name = "cuGetErrorName": fn(CUresult, *mut *const c_char) -> CUresult;
        get_error_string = "cuGetErrorString": fn(CUresult, *mut *const c_char) -> CUresult;
    }
    optional {
        mem_alloc = "cuMemAlloc_v2": fn(*mut CUdeviceptr, usize) -> CUresult;
        mem_free = "cuMemFree_v2": fn(CUdeviceptr) -> CUresult;
        stream_wait_event = "cuStreamWaitEvent": fn(CUstream, CUevent, c_uint) -> CUresult;
        event_synchronize = "cuEventSynchronize": fn(CUevent) -> CUresult;
        // Device memory shared between processes on one host (CUDA IPC).
        mem_get_address_range = "cuMemGetAddressRange_v2": fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult;
        ipc_get_mem_handle = "cuIpcGetMemHandle": fn(*mut CUipcMemHandle, CUdeviceptr) -> CUresult;
        ipc_open_mem_handle = "cuIpcOpenMemHandle_v2": fn(*mut CUdeviceptr, CUipcMemHandle, c_uint) -> CUresult;
        ipc_close_mem_handle = "cuIpcCloseMemHandle": fn(CUdeviceptr) -> CUresult;
        memcpy_dtod_async = "cuMemcpyDtoDAsync_v2": fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult;
    }
}

impl Api {
    /// The path the library was loaded from (as given).
    pub fn path(&self) -> &str {
        &self.path
    }

    fn error_text(
        &self,
        code: CUresult,
        f: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
    ) -> Option<String> {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver writes a pointer to a static string or fails.
        let rc = unsafe { f(code, &mut p) };
        if rc != CUDA_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated static string owned by the driver.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// `Ok` for `CUDA_SUCCESS`, else the error with the driver's name and
    /// description of `code`.
    pub fn check(&self, code: CUresult, call: &'static str) -> Result<(), CudaError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        Err(CudaError {
            call,
            code,
            name: self.error_text(code, self.get_error_name).unwrap_or_else(|| format!("CUDA error {code}")),
            text: self.error_text(code, self.get_error_string).unwrap_or_else(|| "unknown error".to_owned()),
        })
    }
}

impl fmt::Debug for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api").field("path", &self.path).finish_non_exhaustive()
    }
}

type Cache = HashMap<String, Result<Arc<Api>, LoadError>>;
static LOADED: OnceLock<Mutex<Cache>> = OnceLock::new();

/// Load `path` once per process and keep it loaded (the driver is never
/// unloaded). The outcome is cached per path, failures too: detecting
/// memory at every registration must not retry `dlopen` each time.
pub fn load_cached(path: &str) -> Result<Arc<Api>, LoadError> {
    let map = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(path.to_owned()).or_insert_with(|| Api::load(path).map(Arc::new)).clone()
}

/// The driver at `path` if [`load_cached`] already loaded it, or if the
/// process already has that library mapped (the application uses CUDA), in
/// which case it is loaded (and cached) now; `None` otherwise: a process
/// that never used the driver does not get it loaded by this call.
pub fn resident(path: &str) -> Option<Arc<Api>> {
    let map = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(outcome) = map.lock().unwrap_or_else(|p| p.into_inner()).get(path) {
        return outcome.clone().ok();
    }
    if !is_mapped(path) {
        return None;
    }
    load_cached(path).ok()
}

/// `dlopen`'s `RTLD_NOLOAD`: find a library already mapped, never map one.
#[cfg(target_os = "linux")]
const RTLD_NOLOAD: c_int = 0x4;
#[cfg(target_os = "macos")]
const RTLD_NOLOAD: c_int = 0x10;

/// True if the library `path` names is mapped into this process already.
/// Asked on every transfer, so it must cost no file-system access: a walk
/// over the loaded objects (`dl_iterate_phdr`) looks for one of the same
/// file name first, and only then does `dlopen` with `RTLD_NOLOAD` (which,
/// for a name not loaded, searches the library path on disk) confirm it.
#[cfg(target_os = "linux")]
fn is_mapped(path: &str) -> bool {
    if path.is_empty() || !file_name_loaded(path) {
        return false;
    }
    // SAFETY: with RTLD_NOLOAD nothing is loaded, so no initializer runs;
    // the handle only raises the count of a library already mapped, and
    // dropping it lowers it again.
    unsafe { libloading::os::unix::Library::open(Some(path), RTLD_NOLOAD | libloading::os::unix::RTLD_LAZY) }.is_ok()
}

/// Whether an object whose file name is `path`'s is loaded.
#[cfg(target_os = "linux")]
fn file_name_loaded(path: &str) -> bool {
    use std::os::unix::ffi::OsStrExt;
    struct Search<'a> {
        want: &'a std::ffi::OsStr,
        found: bool,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Search` passed below, alive for the walk;
        // `info` and its name are valid during this call.
        let (search, name) = unsafe { (&mut *data.cast::<Search<'_>>(), (*info).dlpi_name) };
        if name.is_null() {
            return 0;
        }
        // SAFETY: a NUL-terminated name owned by the loader.
        let name = std::ffi::OsStr::from_bytes(unsafe { CStr::from_ptr(name) }.to_bytes());
        if std::path::Path::new(name).file_name() == Some(search.want) {
            search.found = true;
            return 1;
        }
        0
    }
    let Some(want) = std::path::Path::new(path).file_name() else { return false };
    let mut search = Search { want, found: false };
    // SAFETY: the callback only reads what the loader hands it and writes
    // `search`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search<'_>).cast()) };
    search.found
}

/// True if the library `path` names is mapped into this process already.
#[cfg(target_os = "macos")]
fn is_mapped(path: &str) -> bool {
    if path.is_empty() {
        return false;
    }
    // SAFETY: with RTLD_NOLOAD nothing is loaded, so no initializer runs.
    unsafe { libloading::os::unix::Library::open(Some(path), RTLD_NOLOAD | libloading::os::unix::RTLD_LAZY) }.is_ok()
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn is_mapped(_path: &str) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn loaded_objects_are_found_by_file_name_without_loading_any() {
        // libc is mapped in every test binary; a made-up library is not.
        assert!(file_name_loaded("libc.so.6") && is_mapped("libc.so.6"));
        assert!(!file_name_loaded("libpdx-not-a-library.so.1") && !is_mapped("libpdx-not-a-library.so.1"));
        assert!(!is_mapped(""));
    }

    #[test]
    fn absent_library_is_named() {
        let e = Api::load("/nonexistent/dir/libcuda.so.1").unwrap_err();
        assert!(matches!(e, LoadError::Open { .. }));
        let text = e.to_string();
        assert!(text.contains("'/nonexistent/dir/libcuda.so.1'"), "{text}");
        assert_eq!(load_cached("/nonexistent/dir/libcuda.so.1").unwrap_err(), e);
        assert!(matches!(Api::load(""), Err(LoadError::Open { .. })));
    }

    #[test]
    fn resident_never_loads_a_library_the_process_lacks() {
        assert!(resident("/nonexistent/dir/libcuda-resident.so.1").is_none());
        assert!(resident("").is_none());
        // libc is mapped, but it is no driver: the failed load is cached.
        assert!(resident("libc.so.6").is_none());
        assert!(matches!(load_cached("libc.so.6"), Err(LoadError::MissingSymbol { .. })));
    }

    #[test]
    fn library_without_the_driver_names_the_first_missing_symbol() {
        // libc loads fine but exports none of the driver's symbols.
        match Api::load("libc.so.6").unwrap_err() {
            LoadError::MissingSymbol { path, symbol, .. } => {
                assert_eq!(path, "libc.so.6");
                assert_eq!(symbol, "cuInit");
            }
            other => panic!("expected MissingSymbol, got {other:?}"),
        }
    }

    #[test]
    fn exactly_the_listed_entry_points_are_required() {
        let mut seen = std::collections::HashSet::new();
        assert!(REQUIRED_SYMBOLS.iter().all(|s| seen.insert(*s)));
        assert_eq!(REQUIRED_SYMBOLS.len(), 18);
        assert!(!REQUIRED_SYMBOLS.contains(&"cuMemAlloc_v2"));
        // CUDA IPC is optional: a driver without it still loads.
        for ipc in ["cuIpcGetMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcCloseMemHandle", "cuMemGetAddressRange_v2"] {
            assert!(!REQUIRED_SYMBOLS.contains(&ipc), "{ipc}");
        }
        assert!(!REQUIRED_SYMBOLS.contains(&"cuMemcpyDtoDAsync_v2"));
        // Passed by value as the driver's 64-byte struct.
        assert_eq!(std::mem::size_of::<CUipcMemHandle>(), CU_IPC_HANDLE_SIZE);
        assert_eq!(std::mem::align_of::<CUipcMemHandle>(), 1);
        assert!(!REQUIRED_SYMBOLS.iter().any(|s| s.starts_with("cuCtxCreate")));
    }
}
