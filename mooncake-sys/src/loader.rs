//! Opening Mooncake's library at run time and resolving its C API once.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use libloading::Library;

use crate::types::*;

/// The library to load when the caller names none (found through the
/// dynamic linker's search path).
pub const DEFAULT_LIB: &str = "libtransfer_engine.so";

/// Why the library could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` failed: absent file, not a shared library, missing
    /// dependencies. `reason` is the loader's own text.
    Open { path: String, reason: String },
    /// The library loaded but lacks a required symbol of the C API.
    MissingSymbol { path: String, symbol: &'static str, reason: String },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Open { path, reason } => {
                write!(f, "cannot load Mooncake's transfer engine library '{path}': {reason}")
            }
            LoadError::MissingSymbol { path, symbol, reason } => write!(
                f,
                "Mooncake library '{path}' does not export '{symbol}' ({reason}); \
                 it is not a build of Mooncake's transfer engine C API (transfer_engine_c.h)"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

macro_rules! api {
    (
        required { $($field:ident = $sym:literal : fn($($arg:ty),*) $(-> $ret:ty)?;)* }
        optional { $($ofield:ident = $osym:literal : fn($($oarg:ty),*) $(-> $oret:ty)?;)* }
    ) => {
        /// Mooncake's C API, every symbol resolved once. Function pointers
        /// stay valid as long as this value lives (it owns the library).
        ///
        /// Calling any of them is `unsafe`: Mooncake checks almost nothing,
        /// so callers pass only an engine it created, batch ids it returned,
        /// and valid pointers.
        pub struct Api {
            path: String,
            $(pub $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
            $(pub $ofield: Option<unsafe extern "C" fn($($oarg),*) $(-> $oret)?>,)*
            _lib: Library,
        }

        /// The symbols every usable library must export.
        pub const REQUIRED_SYMBOLS: &[&str] = &[$($sym),*];

        impl Api {
            /// Open `path` and resolve every symbol.
            pub fn load(path: &str) -> Result<Api, LoadError> {
                // dlopen("") would hand back the running program itself.
                if path.is_empty() {
                    return Err(LoadError::Open { path: String::new(), reason: "the path is empty".to_owned() });
                }
                // SAFETY: loading runs the library's initializers; that is the
                // point of loading Mooncake and cannot be checked from here.
                let lib = unsafe { Library::new(path) }
                    .map_err(|e| LoadError::Open { path: path.to_owned(), reason: e.to_string() })?;
                // SAFETY: each symbol is read with the type of its documented
                // C declaration.
                unsafe {
                    $(
                        let $field = *lib
                            .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(concat!($sym, "\0").as_bytes())
                            .map_err(|e| LoadError::MissingSymbol { path: path.to_owned(), symbol: $sym, reason: e.to_string() })?;
                    )*
                    $(
                        let $ofield = lib
                            .get::<unsafe extern "C" fn($($oarg),*) $(-> $oret)?>(concat!($osym, "\0").as_bytes())
                            .ok()
                            .map(|s| *s);
                    )*
                    Ok(Api { path: path.to_owned(), $($field,)* $($ofield,)* _lib: lib })
                }
            }
        }
    };
}

api! {
    required {
        create_transfer_engine = "createTransferEngine":
            fn(*const c_char, *const c_char, *const c_char, u64, c_int) -> TransferEngineT;
        destroy_transfer_engine = "destroyTransferEngine": fn(TransferEngineT);
        get_local_ip_and_port = "getLocalIpAndPort": fn(TransferEngineT, *mut c_char, usize) -> c_int;
        install_transport = "installTransport": fn(TransferEngineT, *const c_char, *mut *mut c_void) -> TransportT;
        uninstall_transport = "uninstallTransport": fn(TransferEngineT, *const c_char) -> c_int;
        open_segment = "openSegment": fn(TransferEngineT, *const c_char) -> SegmentId;
        close_segment = "closeSegment": fn(TransferEngineT, SegmentId) -> c_int;
        register_local_memory = "registerLocalMemory":
            fn(TransferEngineT, *mut c_void, usize, *const c_char, c_int) -> c_int;
        unregister_local_memory = "unregisterLocalMemory": fn(TransferEngineT, *mut c_void) -> c_int;
        register_local_memory_batch = "registerLocalMemoryBatch":
            fn(TransferEngineT, *mut BufferEntry, usize, *const c_char) -> c_int;
        unregister_local_memory_batch = "unregisterLocalMemoryBatch":
            fn(TransferEngineT, *mut *mut c_void, usize) -> c_int;
        allocate_batch_id = "allocateBatchID": fn(TransferEngineT, usize) -> BatchId;
        submit_transfer = "submitTransfer": fn(TransferEngineT, BatchId, *mut TransferRequest, usize) -> c_int;
        submit_transfer_with_notify = "submitTransferWithNotify":
            fn(TransferEngineT, BatchId, *mut TransferRequest, usize, NotifyMsg) -> c_int;
        get_transfer_status = "getTransferStatus": fn(TransferEngineT, BatchId, usize, *mut TransferStatus) -> c_int;
        free_batch_id = "freeBatchID": fn(TransferEngineT, BatchId) -> c_int;
        get_notifs_from_engine = "getNotifsFromEngine": fn(TransferEngineT, *mut c_int) -> *mut NotifyMsg;
        free_notifs_msg_buf = "freeNotifsMsgBuf": fn(*mut NotifyMsg, c_int) -> c_int;
        gen_notify_in_engine = "genNotifyInEngine": fn(TransferEngineT, u64, NotifyMsg) -> c_int;
    }
    optional {
        discover_topology = "discoverTopology": fn(TransferEngineT) -> c_int;
        open_segment_no_cache = "openSegmentNoCache": fn(TransferEngineT, *const c_char) -> SegmentId;
    }
}

impl Api {
    /// The path the library was loaded from (as given).
    pub fn path(&self) -> &str {
        &self.path
    }
}

impl fmt::Debug for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Api").field("path", &self.path).finish_non_exhaustive()
    }
}

static LOADED: OnceLock<Mutex<HashMap<String, Arc<Api>>>> = OnceLock::new();

/// Load `path` once per process and keep it loaded (a C++ engine library
/// with threads is never unloaded). Failures are not cached, so a library
/// installed later is found by a later call.
pub fn load_cached(path: &str) -> Result<Arc<Api>, LoadError> {
    let map = LOADED.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(api) = map.get(path) {
        return Ok(api.clone());
    }
    let api = Arc::new(Api::load(path)?);
    map.insert(path.to_owned(), api.clone());
    Ok(api)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_library_is_named() {
        let e = Api::load("/nonexistent/dir/libtransfer_engine.so").unwrap_err();
        assert!(matches!(e, LoadError::Open { .. }));
        let text = e.to_string();
        assert!(text.contains("'/nonexistent/dir/libtransfer_engine.so'"), "{text}");
        assert!(load_cached("/nonexistent/dir/libtransfer_engine.so").is_err());
    }

    #[test]
    fn bad_path_is_an_open_error() {
        let dir = std::env::temp_dir().join(format!("mooncake-sys-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_elf = dir.join("libnot_a_library.so");
        std::fs::write(&not_elf, b"this is not an ELF file").unwrap();
        for path in [not_elf.to_str().unwrap(), dir.to_str().unwrap(), ""] {
            let e = Api::load(path).unwrap_err();
            assert!(matches!(&e, LoadError::Open { path: p, .. } if p == path), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn library_without_the_api_names_the_first_missing_symbol() {
        // libc loads fine but exports none of Mooncake's symbols.
        let e = Api::load("libc.so.6").unwrap_err();
        match &e {
            LoadError::MissingSymbol { path, symbol, .. } => {
                assert_eq!(path, "libc.so.6");
                assert_eq!(*symbol, "createTransferEngine");
            }
            other => panic!("expected MissingSymbol, got {other:?}"),
        }
        let text = e.to_string();
        assert!(text.contains("'libc.so.6'") && text.contains("'createTransferEngine'"), "{text}");
    }

    #[test]
    fn required_symbols_are_listed_once() {
        let mut seen = std::collections::HashSet::new();
        assert!(REQUIRED_SYMBOLS.iter().all(|s| seen.insert(*s)));
        assert!(REQUIRED_SYMBOLS.contains(&"submitTransferWithNotify"));
        assert_eq!(REQUIRED_SYMBOLS.len(), 19);
    }
}
