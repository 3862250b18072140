//! Gives the shared library its SONAME, so that programs linked against it
//! record `libpdx.so.<abi>` (not the path they were linked from) and keep
//! working across compatible updates.
//!
//! The ABI version follows Cargo's compatibility rule: for 1.x and later it
//! is the major version (`libpdx.so.1`); while the version is 0.x every minor
//! release may break the ABI, so it is `0.MINOR` (`libpdx.so.0.1`). CMake
//! derives the same name from Cargo.toml when it installs the library
//! (`cmake/PdxVersion.cmake`).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    let abi = if major == "0" { format!("0.{minor}") } else { major };
    // ELF targets only: Mach-O and PE name their libraries differently.
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    // `rustc-link-arg` rather than `rustc-cdylib-link-arg`: Cargo passes a
    // dependency's cdylib link arguments on to the cdylibs built on it
    // (mooncake-c's libtransfer_engine.so would be named libpdx too); the
    // plain form stays with this package (its test and demo executables get
    // the name as well, which the loader ignores).
    if !matches!(os.as_str(), "macos" | "ios" | "windows") {
        println!("cargo:rustc-link-arg=-Wl,-soname,libpdx.so.{abi}");
    }
}
