//! Which transport an engine runs, and on which library: what
//! `createTransferEngine`'s discovery picks, and the check that a protocol
//! pdx does not serve itself names Mooncake's own library (never this one).

use std::ffi::c_void;

use mooncake_sys::Code;
use pdx::config::env::{self, vars, Env, ProcessEnv};

use crate::codes::{McError, McResult};

/// The transport `createTransferEngine(..., auto_discover)` installs, as
/// Mooncake's discovery picks it: `tcp` when `MC_FORCE_TCP` is set or the
/// machine has no RDMA device; `rdma` when it has one and Mooncake's own
/// library is named (`PDX_MOONCAKE_LIB`) to run it. With devices but no
/// library named it serves `tcp` and says so in the log.
pub fn discovered_protocol(env: &dyn Env) -> String {
    if env.var(vars::MC_FORCE_TCP.name).is_some() {
        return "tcp".to_owned();
    }
    let devices = std::fs::read_dir(pdx::config::ib_device::DEFAULT_SYSFS_ROOT).map(|d| d.count()).unwrap_or(0);
    if devices == 0 {
        return "tcp".to_owned();
    }
    if env::read::<String>(env, &vars::PDX_MOONCAKE_LIB).is_some_and(|p| p.contains('/')) {
        return "rdma".to_owned();
    }
    log::warn!(
        "{devices} RDMA device(s) found, but pdx's libtransfer_engine.so serves tcp itself and no Mooncake library \
         is named for rdma (PDX_MOONCAKE_LIB=<path>); serving tcp (set MC_FORCE_TCP=1 to choose it explicitly)"
    );
    "tcp".to_owned()
}

/// A protocol pdx does not serve itself runs on Mooncake's own library,
/// which must be named by a path (its file name is this library's own), and
/// must not be this library.
pub(crate) fn check_mooncake_library(protocol: &str) -> McResult<()> {
    let unsupported = |why: String| McError::new(Code::NotSupportedTransport, format!("protocol {protocol:?}: {why}"));
    let Some(path) = env::read::<String>(&ProcessEnv, &vars::PDX_MOONCAKE_LIB).filter(|p| p.contains('/')) else {
        return Err(unsupported(
            "pdx's libtransfer_engine.so serves tcp itself; other protocols run on Mooncake's own library, named by \
             its path in PDX_MOONCAKE_LIB (e.g. /opt/mooncake/lib/libtransfer_engine.so)"
                .to_owned(),
        ));
    };
    let real = std::fs::canonicalize(&path).map_err(|e| unsupported(format!("PDX_MOONCAKE_LIB={path}: {e}")))?;
    if own_path().is_some_and(|own| own == real) {
        return Err(unsupported(format!(
            "PDX_MOONCAKE_LIB={path} is pdx's own libtransfer_engine.so; name Mooncake's library instead"
        )));
    }
    Ok(())
}

/// The file this library was loaded from.
fn own_path() -> Option<std::path::PathBuf> {
    let mut info: libc::Dl_info = empty_dl_info();
    let here = own_path as *const c_void;
    // SAFETY: dladdr only reads the address and fills `info`.
    if unsafe { libc::dladdr(here, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gives a NUL-terminated name owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    std::fs::canonicalize(name).ok()
}

fn empty_dl_info() -> libc::Dl_info {
    libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    }
}
