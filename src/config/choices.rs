//! Choice lists of the PD-related SGLang arguments.

use parking_lot::RwLock;

/// `DISAGG_TRANSFER_BACKEND_CHOICES` as of SGLang PR #26346, in order.
pub const DEFAULT_TRANSFER_BACKEND_CHOICES: &[&str] = &["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"];

/// `disaggregation_mode` choices.
pub const DISAGGREGATION_MODE_CHOICES: &[&str] = &["null", "prefill", "decode"];

/// `load_balance_method` choices.
pub const LOAD_BALANCE_METHOD_CHOICES: &[&str] =
    &["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"];

/// `encoder_transfer_backend` choices.
pub const ENCODER_TRANSFER_BACKEND_CHOICES: &[&str] = &["zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"];

/// `mamba_scheduler_strategy` choices.
pub const MAMBA_SCHEDULER_STRATEGY_CHOICES: &[&str] = &["auto", "no_buffer", "extra_buffer"];

/// `disaggregation_decode_allocation_policy` choices (sglang 0.5.23).
pub const DECODE_ALLOCATION_POLICY_CHOICES: &[&str] = &["early", "prefill_complete"];

/// `disaggregation_decode_retraction_backup` choices (sglang 0.5.23).
pub const DECODE_RETRACTION_BACKUP_CHOICES: &[&str] = &["cpu_tensor", "host_pool", "none"];

/// `moe_a2a_backend` choices (sglang 0.5.23).
pub const MOE_A2A_BACKEND_CHOICES: &[&str] = &[
    "none",
    "deepep",
    "mooncake",
    "nixl",
    "mori",
    "ascend_fuseep",
    "flashinfer",
    "megamoe",
    "deepep_v2",
    "pplx",
    "ascend_tp",
    "flashinfer_megamoe",
];

/// `decoupled_spec_role` choices (sglang 0.5.23).
pub const DECOUPLED_SPEC_ROLE_CHOICES: &[&str] = &["null", "verifier", "drafter"];

/// `hicache_storage_backend` choices (sglang 0.5.23).
pub const HICACHE_STORAGE_BACKEND_CHOICES: &[&str] = &[
    "file",
    "sim",
    "mooncake",
    "npu_memcache",
    "hf3fs",
    "nixl",
    "aibrix",
    "dynamic",
    "eic",
    "simm",
    "mori",
    "shm",
    "tensorcast",
    "seaweedfs",
];

/// `hicache_write_policy` choices (sglang 0.5.23).
pub const HICACHE_WRITE_POLICY_CHOICES: &[&str] = &["write_back", "write_through", "write_through_selective"];

/// Backends appended by plugins, after the defaults.
static EXTRA_BACKENDS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// The current transfer-backend choices: the defaults, then every name
/// added with [`add_transfer_backend_choices`], in the order added.
pub fn transfer_backend_choices() -> Vec<String> {
    let mut all: Vec<String> = DEFAULT_TRANSFER_BACKEND_CHOICES.iter().map(|s| (*s).to_owned()).collect();
    all.extend(EXTRA_BACKENDS.read().iter().cloned());
    all
}

/// SGLang's `add_disagg_transfer_backend_choices`: append backend names
/// (process-wide). Names already present are not added twice.
pub fn add_transfer_backend_choices<S: AsRef<str>>(names: &[S]) {
    let mut extra = EXTRA_BACKENDS.write();
    for name in names {
        let name = name.as_ref();
        if !DEFAULT_TRANSFER_BACKEND_CHOICES.contains(&name) && !extra.iter().any(|e| e == name) {
            extra.push(name.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_choices_in_upstream_order_and_appendable() {
        assert_eq!(&transfer_backend_choices()[..6], DEFAULT_TRANSFER_BACKEND_CHOICES);
        add_transfer_backend_choices(&["pdx_test_plugin_backend", "mooncake"]);
        add_transfer_backend_choices(&["pdx_test_plugin_backend"]);
        let all = transfer_backend_choices();
        assert_eq!(all.iter().filter(|b| *b == "pdx_test_plugin_backend").count(), 1);
        assert_eq!(all.iter().filter(|b| *b == "mooncake").count(), 1);
        assert!(all.iter().position(|b| b == "pdx_test_plugin_backend").unwrap() >= 6);
    }
}
