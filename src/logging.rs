//! Logging setup: `log` + `env_logger`, configured by `RUST_LOG`
//! (default: warnings and errors). Installed once, on the first pdx call, and
//! only if the host has not installed a `log` logger of its own.

use std::sync::Once;

static INIT: Once = Once::new();

/// Install the logger once; cheap after the first call.
pub fn init() {
    INIT.call_once(|| {
        let env = env_logger::Env::default().default_filter_or("warn");
        // An error means another logger is installed: keep it.
        let _ = env_logger::Builder::from_env(env).format_timestamp_micros().try_init();
    });
}
