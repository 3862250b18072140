//! C ABI for arguments, normalization, IB devices and transport resolution.
