//! SGLang PD-disaggregation argument rules and transport resolution (pure Rust, no C types).
