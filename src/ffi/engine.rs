//! C ABI for the transfer engine.
