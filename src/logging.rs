//! Logging setup: `log` + `env_logger`, configured by `RUST_LOG`
//! (default: warnings and errors). Installed once, on the first pdx call, and
//! only if the host has not installed a `log` logger of its own.

use std::sync::Once;

static INIT: Once = Once::new();

/// Install the logger once; cheap after the first call.
pub fn init() {
    INIT.call_once(|| {
        use crate::config::env::{read, vars, ProcessEnv};
        let filter: String = read(&ProcessEnv, &vars::RUST_LOG).unwrap_or_else(|| "warn".to_owned());
        // An error means another logger is installed: keep it.
        let _ = env_logger::Builder::new().parse_filters(&filter).format_timestamp_micros().try_init();
    });
}
