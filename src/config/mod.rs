//! SGLang PD-disaggregation argument rules and transport resolution (pure
//! Rust, no C types).
//!
//! - [`choices`]: backend / mode / load-balance choice lists.
//! - [`args`]: the typed ServerArgs subset, set/get by field name or CLI flag.
//! - [`argv`]: reading the PD flags out of a command line (argparse rules).
//! - [`sglang_flags`]: SGLang's option lists at the rule sets' commits.
//! - [`engine_options`]: per-engine options (`gpu_id`, `device_source`, settings).
//! - [`env`]: environment access with SGLang's `environ.py` rules.
//! - [`file`]: reading a file configuration names (regular, bounded).
//! - [`hook_texts`]: the hook's texts, shared by every rule set.
//! - [`rules`]: `handle_pd_disaggregation` in three versions, plus normalization.
//! - [`rules_2026_10`]: the fourth, sglang 0.5.23's, with its IB-validation placement.
//! - [`efa`]: sglang 0.5.23's EFA allocator guard.
//! - [`load_balance`]: SGLang's `_handle_load_balance_method`.
//! - [`ib_device`]: IB device configuration parsing and validation.
//! - [`transport`]: protocol / hostname / device resolution.
//! - [`net`]: session ids and free ports.
//! - [`message`]: the info/warning lines the rules produce.
//! - [`py`]: Python-compatible formatting helpers for exact messages.

pub mod args;
pub mod argv;
pub mod choices;
pub mod efa;
pub mod engine_options;
pub mod env;
pub mod file;
pub mod hook_texts;
pub mod ib_device;
pub mod load_balance;
pub mod message;
pub mod net;
pub mod py;
pub mod rules;
pub mod rules_2026_10;
pub mod sglang_flags;
pub mod transport;

pub use args::{RuleSet, ServerArgs};
pub use argv::parse_argv;
pub use env::{Env, MapEnv, ProcessEnv};
pub use hook_texts::Refusal;
pub use message::{Level, Message};
pub use rules::normalize;
pub use transport::{resolve_transport, resolve_transport_from_process_env, TransportChoice};
