//! Library version, checked against Cargo.toml and the header macros by tests.

use std::ffi::c_char;

/// `"pdx/MAJOR.MINOR.PATCH"`, NUL-terminated.
const VERSION: &str = concat!("pdx/", env!("CARGO_PKG_VERSION"), "\0");

/// The library version as a static string, e.g. `"pdx/0.1.0"`.
///
/// Never NULL; owned by pdx for the life of the process. Compare with the
/// `PDX_VERSION_*` macros of the header you compiled against.
#[no_mangle]
pub extern "C" fn pdx_version() -> *const c_char {
    VERSION.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_matches_cargo() {
        // SAFETY: pdx returns NUL-terminated strings that outlive this use.
        let s = unsafe { std::ffi::CStr::from_ptr(super::pdx_version()) };
        assert_eq!(s.to_str().unwrap(), format!("pdx/{}", env!("CARGO_PKG_VERSION")));
    }
}
