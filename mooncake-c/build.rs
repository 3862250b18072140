// The shared library's SONAME is its file name, as Mooncake's own build
// gives it, so a program linked against either finds whichever copy the
// loader meets first.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libtransfer_engine.so");
}
