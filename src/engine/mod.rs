//! The native TCP transfer engine, wire-compatible with Mooncake (pure Rust, no C types).
