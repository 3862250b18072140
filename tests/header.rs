//! The committed C header must equal a fresh cbindgen run, and its version
//! macros must match Cargo.toml.
//!
//! Regenerate with `PDX_BLESS_HEADER=1 cargo test --test header`.

use std::path::PathBuf;

fn version_block() -> String {
    let major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: u32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let patch: u32 = env!("CARGO_PKG_VERSION_PATCH").parse().unwrap();
    format!(
        "\n#define PDX_VERSION_MAJOR {major}\n#define PDX_VERSION_MINOR {minor}\n#define PDX_VERSION_PATCH {patch}\n\
         /* (MAJOR << 16) | (MINOR << 8) | PATCH */\n#define PDX_VERSION_NUMBER {}\n",
        (major << 16) | (minor << 8) | patch
    )
}

fn generate() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(version_block());
    let mut out = Vec::new();
    cbindgen::Builder::new().with_crate(&root).with_config(config).generate().expect("cbindgen failed").write(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn header_is_fresh() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/pdx.h");
    let fresh = generate();
    if std::env::var_os("PDX_BLESS_HEADER").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/pdx.h is stale; run `PDX_BLESS_HEADER=1 cargo test --test header` and commit it"
    );
}

#[test]
fn header_version_macros_match_cargo() {
    let header = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include/pdx.h")).unwrap();
    for (name, value) in [
        ("PDX_VERSION_MAJOR", env!("CARGO_PKG_VERSION_MAJOR")),
        ("PDX_VERSION_MINOR", env!("CARGO_PKG_VERSION_MINOR")),
        ("PDX_VERSION_PATCH", env!("CARGO_PKG_VERSION_PATCH")),
    ] {
        assert!(header.contains(&format!("#define {name} {value}\n")), "{name} != {value}");
    }
}
