//! The `2026-10` rule set: `handle_pd_disaggregation` as sglang 0.5.23
//! (PyPI, October 2026) ships it in
//! `sglang/srt/arg_groups/pd_disaggregation_hook.py`, with the resolution
//! steps around it that change what it reads: the deprecated
//! `--dp-size N --enable-dp-attention` spelling is resolved first
//! (`handle_deprecated_dp_attention`), load balancing after
//! (`handle_load_balance_method`), as 0.5.23's `ServerArgs` pipeline runs them.
//!
//! Texts are 0.5.23's, byte for byte; `python/tests/test_sglang_oracle.py`
//! runs the installed package's own hook against this one.

use super::args::{ServerArgs, DEFAULT_BOOTSTRAP_PORT};
use super::env::{self, names, Env};
use super::hook_texts::{
    rust_server_port_conflict_error, rust_server_port_info, staging_error, HookOutcome, DCP_PREFILL_WARNING,
    MOONCAKE_TCP_INFO, PREFILL_FAKE, RADIX_DP_WARNING, RADIX_ENABLED_WARNING, RADIX_FAKE, RADIX_HISPARSE,
};
use super::load_balance::handle_load_balance_method;
use super::message::Message;
use super::py;
use crate::error::{Error, Result};

/// WARNING: decode without the radix cache (0.5.23's text; earlier sets say
/// `KV cache is forced as chunk cache for decode server`).
pub const RADIX_DISABLED_WARNING: &str = "Radix cache is disabled for decode server";
/// ValueError: the host receive threshold outside `[0, 1]`.
pub const HOST_RECEIVE_RANGE: &str = "--disaggregation-decode-host-receive-threshold must be between 0 and 1";
/// ValueError: host receive with HiSparse or role switching.
pub const HOST_RECEIVE_HISPARSE_OR_ROLE_SWITCH: &str =
    "Decode host receive does not yet support HiSparse or role switching";
/// ValueError: host receive with `cpu_tensor` retraction.
pub const HOST_RECEIVE_CPU_TENSOR: &str = "Decode host KV buffering requires host_pool retraction";

/// The backends decode DCP accepts under `2026-10`.
pub const DCP_DECODE_BACKENDS: &[&str] = &["mooncake", "nixl", "mori", "ascend", "fake"];

/// The transfer backends whose bootstrap server the Rust server's registry
/// stands in for (0.5.23's `rust_server_serves_kv_bootstrap`: each one's
/// bootstrap server derives from `CommonKVBootstrapServer`); `fake` has
/// none.
const RUST_SERVER_SERVES: &[&str] = &["mooncake", "mori", "ascend", "nixl"];
/// The members of 0.5.23's `TransferBackend` enum.
const TRANSFER_BACKEND_ENUM: &[&str] = &["mooncake", "mori", "nixl", "ascend", "fake"];

/// ValueError (2026-10): decode DCP with a backend outside
/// [`DCP_DECODE_BACKENDS`] (the backend in Python's repr).
pub fn dcp_backend_error(backend: &str) -> String {
    format!(
        "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, mori, ascend, or fake for synthetic benchmarking, got {}.",
        py::repr_str(backend)
    )
}

/// ValueError: the `prefill_complete` policy with what it does not support.
pub fn prefill_complete_error(unsupported: &[&str]) -> String {
    format!(
        "--disaggregation-decode-allocation-policy prefill_complete does not yet support {}",
        unsupported.join(", ")
    )
}

/// ValueError: PD role switching with what it does not rebuild.
pub fn role_switch_error(unsupported: &[String]) -> String {
    format!(
        "--enable-pd-role-switch does not rebuild role-specific state for the following features: {}. Remove these options or drop --enable-pd-role-switch.",
        unsupported.join(", ")
    )
}

/// INFO: the Rust server leaves the port of a backend with its own
/// bootstrap server alone (unreachable with SGLang's built-in backends).
pub fn rust_server_keeps_port_info(backend: &str, bootstrap_port: i64) -> String {
    format!("SGLANG_RUST_SERVER: transfer backend {backend} runs its own KV bootstrap server; keeping disaggregation_bootstrap_port {bootstrap_port}")
}

/// ValueError: Python's `TransferBackend(name)` for a name the enum lacks.
pub fn not_a_transfer_backend(backend: &str) -> String {
    format!("{} is not a valid TransferBackend", py::repr_str(backend))
}

fn read_bool(env: &dyn Env, name: &str, out: &mut HookOutcome) -> bool {
    let v = env::get_bool(env, name, false);
    out.messages.extend(v.warning.map(Message::warning));
    v.value
}

/// 0.5.23's `handle_deprecated_dp_attention`: `--dp-size N
/// --enable-dp-attention` means `--attn-dp-size N` (unless that was given);
/// `dp_size` then counts replicas. The flag itself is spent.
fn handle_deprecated_dp_attention(args: &mut ServerArgs) {
    if !args.enable_dp_attention {
        return;
    }
    if args.attn_dp_size == 1 {
        args.attn_dp_size = args.dp_size;
        args.dp_size = 1;
    }
    args.enable_dp_attention = false;
}

/// `attn_dp_enabled_of`: attention runs data parallel.
fn attn_dp_enabled(args: &ServerArgs) -> bool {
    args.attn_dp_size > 1
}

/// `handle_pd_disaggregation(server_args)` of sglang 0.5.23. Mutates
/// `args` in place, also on error ([`normalize`] works on a copy), and
/// appends to `out` as SGLang logs (on error: the lines before it).
///
/// [`normalize`]: super::rules::normalize
pub fn handle_pd_disaggregation(args: &mut ServerArgs, env: &dyn Env, out: &mut HookOutcome) -> Result<()> {
    if args.disaggregation_transfer_backend == "mooncake_tcp" {
        out.set_default_mc_force_tcp = true;
        args.disaggregation_transfer_backend = "mooncake".into();
        args.disaggregation_ib_device = None;
        out.messages.push(Message::info(MOONCAKE_TCP_INFO));
    }

    if args.disaggregation_decode_allocation_policy == "prefill_complete" {
        validate_prefill_complete(args, env, out)?;
        if args.disaggregation_mode == "prefill" && args.optimistic_prefill_attempts == 0 {
            args.optimistic_prefill_attempts = 1;
        }
    }

    if args.disaggregation_mode == "prefill" && args.dcp_size > 1 {
        out.messages.push(Message::warning(DCP_PREFILL_WARNING));
    }

    // `not 0 <= t <= 1` (a NaN fails it too), then `t < 1`.
    let threshold = args.disaggregation_decode_host_receive_threshold.0;
    if !(0.0..=1.0).contains(&threshold) {
        return Err(Error::value_error(HOST_RECEIVE_RANGE));
    }
    if threshold < 1.0 {
        if args.enable_hisparse || args.enable_pd_role_switch {
            return Err(Error::value_error(HOST_RECEIVE_HISPARSE_OR_ROLE_SWITCH));
        }
        if args.disaggregation_decode_retraction_backup.as_deref() == Some("cpu_tensor") {
            return Err(Error::value_error(HOST_RECEIVE_CPU_TENSOR));
        }
        args.disaggregation_decode_retraction_backup = Some("host_pool".into());
    }

    if args.disaggregation_mode == "decode"
        && args.dcp_size > 1
        && !DCP_DECODE_BACKENDS.contains(&args.disaggregation_transfer_backend.as_str())
    {
        return Err(Error::value_error(dcp_backend_error(&args.disaggregation_transfer_backend)));
    }

    match args.disaggregation_mode.as_str() {
        "decode" => {
            if args.disaggregation_decode_enable_radix_cache {
                if args.enable_hisparse {
                    return Err(Error::value_error(RADIX_HISPARSE));
                }
                if args.disaggregation_transfer_backend == "fake" {
                    return Err(Error::value_error(RADIX_FAKE));
                }
                if attn_dp_enabled(args) {
                    out.messages.push(Message::warning(RADIX_DP_WARNING));
                }
                args.disable_radix_cache = false;
                out.messages.push(Message::warning(RADIX_ENABLED_WARNING));
            } else {
                args.disable_radix_cache = true;
                out.messages.push(Message::warning(RADIX_DISABLED_WARNING));
            }
            if args.disaggregation_decode_extra_slots.is_none() {
                args.disaggregation_decode_extra_slots = Some(default_extra_slots(args)?);
            }
        }
        "prefill" => {
            if args.disaggregation_transfer_backend == "fake" {
                return Err(Error::assertion_error(PREFILL_FAKE));
            }
            if read_bool(env, names::SGLANG_RUST_SERVER, out) {
                alias_bootstrap_port_to_api_port(args, out)?;
            }
        }
        _ => {}
    }

    if matches!(args.disaggregation_mode.as_str(), "prefill" | "decode") {
        let staging = read_bool(env, names::SGLANG_DISAGG_STAGING_BUFFER, out);
        let backend = args.disaggregation_transfer_backend.as_str();
        if staging && backend != "mooncake" && backend != "nixl" {
            return Err(Error::value_error(staging_error(backend)));
        }
        if args.enable_pd_role_switch {
            let unsupported = role_switch_unsupported(args);
            if !unsupported.is_empty() {
                return Err(Error::value_error(role_switch_error(&unsupported)));
            }
        }
    }
    Ok(())
}

/// 0.5.23's extra decode slots: 0 without `max_running_requests`; else
/// `per_worker = max(1, mrr // (dp_size * attn_dp_size))` (floor
/// division) and `2 * per_worker` when that is at most 32, else 0.
///
/// Where the divisor is 0 Python raises `ZeroDivisionError`; pdx refuses it
/// as a ValueError with Python's text (see docs/sglang-rules.md).
fn default_extra_slots(args: &ServerArgs) -> Result<i64> {
    let Some(mrr) = args.max_running_requests else { return Ok(0) };
    let ranks = args.dp_size.saturating_mul(args.attn_dp_size);
    if ranks == 0 {
        return Err(Error::value_error("integer division or modulo by zero"));
    }
    let per_worker = py_floor_div(mrr, ranks).max(1);
    Ok(if per_worker <= 32 { per_worker.saturating_mul(2) } else { 0 })
}

/// Python's `a // b` for `b != 0` (rounds toward negative infinity).
fn py_floor_div(a: i64, b: i64) -> i64 {
    let q = a.wrapping_div(b);
    if (a % b != 0) && ((a < 0) != (b < 0)) {
        q - 1
    } else {
        q
    }
}

/// `_validate_prefill_complete`: every unsupported setting, listed in
/// 0.5.23's order, in one ValueError.
fn validate_prefill_complete(args: &ServerArgs, env: &dyn Env, out: &mut HookOutcome) -> Result<()> {
    let mode = args.disaggregation_mode.as_str();
    let mut unsupported = Vec::new();
    if mode != "prefill" && mode != "decode" {
        unsupported.push("aggregated serving");
    }
    if args.disaggregation_transfer_backend != "mooncake" {
        unsupported.push("transfer backends other than Mooncake");
    }
    if args.pp_size != 1 || args.attn_cp_size != 1 || args.dcp_size != 1 {
        unsupported.push("pipeline or attention context parallelism");
    }
    // 0.5.23 reads the deprecated flag here, after resolving it to false,
    // so this is 1 in its pipeline (and in pdx's, which resolves it first).
    let attn_dp_size = if args.enable_dp_attention { args.dp_size } else { 1 };
    if args.tp_size != attn_dp_size {
        unsupported.push("attention tensor parallelism greater than one");
    }
    if args.enable_pdmux || args.decoupled_spec_role != "null" {
        unsupported.push("PD multiplexing or decoupled speculation");
    }
    if args.enable_pd_role_switch {
        unsupported.push("runtime PD role switching");
    }
    if args.encoder_only || args.language_only {
        unsupported.push("encoder disaggregation");
    }
    if args.enable_hisparse {
        unsupported.push("HiSparse");
    }
    if args.disaggregation_decode_host_receive_threshold.0 < 1.0 {
        unsupported.push("decode host KV buffering");
    }
    if mode == "decode" && (args.disaggregation_decode_enable_radix_cache || args.enable_hierarchical_cache) {
        unsupported.push("decode radix cache or decode HiCache");
    }
    if mode == "prefill"
        && args.enable_hierarchical_cache
        && (args.hicache_storage_backend.is_some() || args.hicache_write_policy != "write_back")
    {
        unsupported.push("prefill HiCache other than L2 write_back");
    }
    if read_bool(env, names::SGLANG_DISAGG_STAGING_BUFFER, out) {
        unsupported.push("staging buffers");
    }
    if read_bool(env, names::SGLANG_RUST_SERVER, out) {
        unsupported.push("the Rust bootstrap registry");
    }
    if unsupported.is_empty() {
        Ok(())
    } else {
        Err(Error::value_error(prefill_complete_error(&unsupported)))
    }
}

/// The role-switch refusal list, in 0.5.23's order.
fn role_switch_unsupported(args: &ServerArgs) -> Vec<String> {
    let mut unsupported = Vec::new();
    if args.ep_size > 1 {
        unsupported.push(format!("expert parallelism (--ep-size {})", args.ep_size));
    }
    if args.moe_a2a_backend != "none" {
        unsupported.push(format!("MoE all-to-all (--moe-a2a-backend {})", args.moe_a2a_backend));
    }
    if args.pp_size > 1 {
        unsupported.push(format!("pipeline parallelism (--pp-size {})", args.pp_size));
    }
    if attn_dp_enabled(args) && args.enable_dp_attention_local_control_broadcast {
        unsupported.push("DP attention local control broadcast".to_owned());
    }
    if args.dcp_size > 1 {
        unsupported.push(format!("decode context parallelism (--dcp-size {})", args.dcp_size));
    }
    if let Some(alg) = &args.speculative_algorithm {
        unsupported.push(format!("speculative decoding (--speculative-algorithm {alg})"));
    }
    unsupported
}

/// 0.5.23's `_alias_bootstrap_port_to_api_port`: only for a backend whose
/// bootstrap server the Rust server's registry replaces.
fn alias_bootstrap_port_to_api_port(args: &mut ServerArgs, out: &mut HookOutcome) -> Result<()> {
    let backend = args.disaggregation_transfer_backend.as_str();
    if !TRANSFER_BACKEND_ENUM.contains(&backend) {
        return Err(Error::value_error(not_a_transfer_backend(backend)));
    }
    let (bootstrap_port, port) = (args.disaggregation_bootstrap_port, args.port);
    if !RUST_SERVER_SERVES.contains(&backend) {
        out.messages.push(Message::info(rust_server_keeps_port_info(backend, bootstrap_port)));
        return Ok(());
    }
    if bootstrap_port != DEFAULT_BOOTSTRAP_PORT && bootstrap_port != port {
        return Err(Error::value_error(rust_server_port_conflict_error(bootstrap_port, port)));
    }
    if bootstrap_port != port {
        out.messages.push(Message::info(rust_server_port_info(bootstrap_port, port)));
        args.disaggregation_bootstrap_port = port;
    }
    Ok(())
}

/// The 0.5.23 pipeline around the hook: the deprecated DP-attention
/// spelling, the hook, load balancing; then `enable_dp_attention` reads
/// back as 0.5.23's `resolved_dict` reports it (attention DP runs). The
/// hook's lines go to `out`, also those before an error.
pub fn resolve(args: &mut ServerArgs, env: &dyn Env, out: &mut HookOutcome) -> Result<()> {
    handle_deprecated_dp_attention(args);
    handle_pd_disaggregation(args, env, out)?;
    handle_load_balance_method(args)?;
    args.enable_dp_attention = attn_dp_enabled(args);
    Ok(())
}

/// Whether 0.5.23 validates the IB device (`handle_encoder_disaggregation`,
/// after the hook): [`ServerArgs::ib_device_validated`].
pub fn ib_validation_applies(args: &ServerArgs) -> bool {
    args.ib_device_validated()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::args::RuleSet;
    use crate::config::env::MapEnv;
    use crate::config::rules::normalize;
    use crate::error::ErrorKind;

    fn args(pairs: &[(&str, &str)]) -> ServerArgs {
        let mut a = ServerArgs { pdx_rules: RuleSet::Upstream202610, ..Default::default() };
        for (k, v) in pairs {
            a.set(k, Some(v)).unwrap();
        }
        a
    }

    fn run(pairs: &[(&str, &str)], env: &MapEnv) -> Result<(ServerArgs, Vec<String>)> {
        let mut a = args(pairs);
        let msgs = normalize(&mut a, env)?;
        Ok((a, msgs.into_iter().map(|m| m.text).collect()))
    }

    fn value_error(pairs: &[(&str, &str)], env: &MapEnv) -> String {
        let e = run(pairs, env).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ValueError, "{pairs:?}: {}", e.message());
        e.message().to_owned()
    }

    #[test]
    fn decode_without_radix_says_disabled() {
        let (a, msgs) = run(&[("disaggregation_mode", "decode")], &MapEnv::new()).unwrap();
        assert!(a.disable_radix_cache);
        assert_eq!(msgs, [RADIX_DISABLED_WARNING]);
        assert_eq!(a.load_balance_method, "round_robin");
        assert_eq!(a.disaggregation_decode_extra_slots, Some(0));
    }

    #[test]
    fn decode_radix_allows_speculative_and_warns_with_attention_dp() {
        let pairs = [
            ("disaggregation_mode", "decode"),
            ("disaggregation_decode_enable_radix_cache", "true"),
            ("speculative_algorithm", "EAGLE"),
            ("attn_dp_size", "2"),
        ];
        let (a, msgs) = run(&pairs, &MapEnv::new()).unwrap();
        assert!(!a.disable_radix_cache);
        assert!(a.enable_dp_attention, "reads back as attention DP running");
        assert_eq!(msgs, [RADIX_DP_WARNING, RADIX_ENABLED_WARNING]);
    }

    #[test]
    fn deprecated_dp_attention_becomes_attn_dp_size() {
        let pairs = [
            ("disaggregation_mode", "decode"),
            ("dp_size", "4"),
            ("enable_dp_attention", "true"),
            ("max_running_requests", "64"),
        ];
        let (a, _) = run(&pairs, &MapEnv::new()).unwrap();
        assert_eq!((a.dp_size, a.attn_dp_size, a.enable_dp_attention), (1, 4, true));
        // 64 // (1 * 4) = 16 per worker: 32 extra slots.
        assert_eq!(a.disaggregation_decode_extra_slots, Some(32));
    }

    #[test]
    fn extra_slots_floor_at_one_per_worker() {
        for (mrr, dp, attn, want) in [(1, 4, 1, 2), (64, 1, 1, 0), (64, 2, 1, 64), (-5, 2, 1, 2), (0, 1, 1, 2)] {
            let pairs = [
                ("disaggregation_mode", "decode"),
                ("max_running_requests", &*mrr.to_string()),
                ("dp_size", &*dp.to_string()),
                ("attn_dp_size", &*attn.to_string()),
            ];
            let owned: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, *v)).collect();
            let (a, _) = run(&owned, &MapEnv::new()).unwrap();
            assert_eq!(a.disaggregation_decode_extra_slots, Some(want), "{mrr} {dp} {attn}");
        }
    }

    #[test]
    fn dcp_decode_backends_widened_and_radix_allowed() {
        for ok in ["mori", "ascend", "fake", "mooncake_tcp"] {
            run(
                &[("disaggregation_mode", "decode"), ("dcp_size", "2"), ("disaggregation_transfer_backend", ok)],
                &MapEnv::new(),
            )
            .unwrap();
        }
        choices_plugin();
        let e = value_error(
            &[
                ("disaggregation_mode", "decode"),
                ("dcp_size", "2"),
                ("disaggregation_transfer_backend", "pdx_i46_plugin"),
            ],
            &MapEnv::new(),
        );
        assert_eq!(e, "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, mori, ascend, or fake for synthetic benchmarking, got 'pdx_i46_plugin'.");
        let (a, _) = run(
            &[
                ("disaggregation_mode", "decode"),
                ("dcp_size", "2"),
                ("disaggregation_decode_enable_radix_cache", "1"),
                ("enable_hierarchical_cache", "1"),
            ],
            &MapEnv::new(),
        )
        .unwrap();
        assert!(!a.disable_radix_cache);
    }

    fn choices_plugin() {
        crate::config::choices::add_transfer_backend_choices(&["pdx_i46_plugin"]);
    }

    #[test]
    fn host_receive_threshold() {
        for bad in ["1.5", "-0.1", "nan", "inf"] {
            assert_eq!(
                value_error(&[("disaggregation_decode_host_receive_threshold", bad)], &MapEnv::new()),
                HOST_RECEIVE_RANGE
            );
        }
        let (a, _) = run(&[("disaggregation_decode_host_receive_threshold", "0.5")], &MapEnv::new()).unwrap();
        assert_eq!(a.disaggregation_decode_retraction_backup.as_deref(), Some("host_pool"));
        assert_eq!(a.get("disaggregation_decode_host_receive_threshold").unwrap().as_deref(), Some("0.5"));
        for extra in [("enable_hisparse", "1"), ("enable_pd_role_switch", "1")] {
            let pairs = [("disaggregation_decode_host_receive_threshold", "0"), extra];
            assert_eq!(value_error(&pairs, &MapEnv::new()), HOST_RECEIVE_HISPARSE_OR_ROLE_SWITCH);
        }
        let pairs = [
            ("disaggregation_decode_host_receive_threshold", "0.9"),
            ("disaggregation_decode_retraction_backup", "cpu_tensor"),
        ];
        assert_eq!(value_error(&pairs, &MapEnv::new()), HOST_RECEIVE_CPU_TENSOR);
    }

    #[test]
    fn prefill_complete_lists_everything_in_order() {
        let env = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", "1"), ("SGLANG_RUST_SERVER", "1")]);
        let pairs = [
            ("disaggregation_decode_allocation_policy", "prefill_complete"),
            ("disaggregation_transfer_backend", "nixl"),
            ("pp_size", "2"),
            ("tp_size", "2"),
            ("enable_pdmux", "1"),
            ("enable_pd_role_switch", "1"),
            ("encoder_only", "1"),
            ("enable_hisparse", "1"),
            ("disaggregation_decode_host_receive_threshold", "0.5"),
        ];
        assert_eq!(
            value_error(&pairs, &env),
            prefill_complete_error(&[
                "aggregated serving",
                "transfer backends other than Mooncake",
                "pipeline or attention context parallelism",
                "attention tensor parallelism greater than one",
                "PD multiplexing or decoupled speculation",
                "runtime PD role switching",
                "encoder disaggregation",
                "HiSparse",
                "decode host KV buffering",
                "staging buffers",
                "the Rust bootstrap registry",
            ])
        );
        let (a, _) = run(
            &[("disaggregation_decode_allocation_policy", "prefill_complete"), ("disaggregation_mode", "prefill")],
            &MapEnv::new(),
        )
        .unwrap();
        assert_eq!(a.optimistic_prefill_attempts, 1);
    }

    #[test]
    fn role_switch_lists_what_it_does_not_rebuild() {
        let pairs = [
            ("disaggregation_mode", "decode"),
            ("enable_pd_role_switch", "1"),
            ("ep_size", "2"),
            ("moe_a2a_backend", "deepep"),
            ("pp_size", "2"),
            ("attn_dp_size", "2"),
            ("enable_dp_attention_local_control_broadcast", "1"),
            ("dcp_size", "2"),
            ("speculative_algorithm", "EAGLE"),
        ];
        assert_eq!(
            value_error(&pairs, &MapEnv::new()),
            "--enable-pd-role-switch does not rebuild role-specific state for the following features: expert parallelism (--ep-size 2), MoE all-to-all (--moe-a2a-backend deepep), pipeline parallelism (--pp-size 2), DP attention local control broadcast, decode context parallelism (--dcp-size 2), speculative decoding (--speculative-algorithm EAGLE). Remove these options or drop --enable-pd-role-switch."
        );
        run(&[("enable_pd_role_switch", "1"), ("ep_size", "2")], &MapEnv::new()).unwrap();
    }

    #[test]
    fn rust_server_backends() {
        let env = MapEnv::from_pairs(&[("SGLANG_RUST_SERVER", "1")]);
        for b in ["mooncake", "nixl", "mori", "ascend"] {
            let (a, _) =
                run(&[("disaggregation_mode", "prefill"), ("disaggregation_transfer_backend", b)], &env).unwrap();
            assert_eq!(a.disaggregation_bootstrap_port, 30000, "{b}");
        }
        choices_plugin();
        let e = value_error(
            &[("disaggregation_mode", "prefill"), ("disaggregation_transfer_backend", "pdx_i46_plugin")],
            &env,
        );
        assert_eq!(e, "'pdx_i46_plugin' is not a valid TransferBackend");
    }

    #[test]
    fn ib_validation_placement() {
        assert!(ib_validation_applies(&args(&[("disaggregation_mode", "prefill")])));
        assert!(!ib_validation_applies(&args(&[])));
        assert!(!ib_validation_applies(&args(&[
            ("disaggregation_mode", "decode"),
            ("disaggregation_transfer_backend", "nixl")
        ])));
        assert!(ib_validation_applies(&args(&[("encoder_transfer_backend", "mooncake")])));
    }

    /// normalize's refusal, after checking that it changed neither the
    /// arguments nor the environment: (kind, text, lines logged before it).
    fn refused(pairs: &[(&str, &str)], env: &MapEnv) -> (ErrorKind, String, Vec<String>) {
        let mut a = args(pairs);
        let before = a.clone();
        let mc_force_tcp = env.var("MC_FORCE_TCP");
        let r = normalize(&mut a, env).unwrap_err();
        assert_eq!(a, before, "{pairs:?}: the arguments changed");
        assert_eq!(env.var("MC_FORCE_TCP"), mc_force_tcp, "{pairs:?}: the environment changed");
        (r.kind(), r.message().to_owned(), r.messages.into_iter().map(|m| m.text).collect())
    }

    /// The three lines 0.5.23 logs before it raises, each kept with the
    /// refusal (issue 53: 27, 11 and 2 of 300 sampled combinations).
    #[test]
    fn refusal_keeps_the_alias_line() {
        for (extra, error) in [
            (("disaggregation_decode_host_receive_threshold", "1.5"), HOST_RECEIVE_RANGE.to_owned()),
            (
                ("disaggregation_decode_allocation_policy", "prefill_complete"),
                prefill_complete_error(&["aggregated serving"]),
            ),
        ] {
            let pairs = [("disaggregation_transfer_backend", "mooncake_tcp"), extra];
            let env = MapEnv::new();
            assert_eq!(refused(&pairs, &env), (ErrorKind::ValueError, error, vec![MOONCAKE_TCP_INFO.to_owned()]));
            assert_eq!(env.var("MC_FORCE_TCP"), None, "refused: MC_FORCE_TCP not set");
        }
        // An existing MC_FORCE_TCP is kept as it was, and pdx's own line
        // about it is not among SGLang's.
        let env = MapEnv::from_pairs(&[("MC_FORCE_TCP", "0")]);
        let pairs = [
            ("disaggregation_mode", "prefill"),
            ("disaggregation_transfer_backend", "mooncake_tcp"),
            ("enable_pd_role_switch", "true"),
            ("pp_size", "2"),
        ];
        let (_, text, lines) = refused(&pairs, &env);
        assert_eq!(text, role_switch_error(&["pipeline parallelism (--pp-size 2)".to_owned()]));
        assert_eq!(lines, [MOONCAKE_TCP_INFO]);
    }

    #[test]
    fn refusal_keeps_the_dcp_prefill_note() {
        let pairs =
            [("disaggregation_mode", "prefill"), ("dcp_size", "2"), ("disaggregation_transfer_backend", "fake")];
        let want = (ErrorKind::AssertionError, PREFILL_FAKE.to_owned(), vec![DCP_PREFILL_WARNING.to_owned()]);
        assert_eq!(refused(&pairs, &MapEnv::new()), want);
        // With the alias and the Rust server: both lines, in SGLang's order.
        let pairs = [
            ("disaggregation_mode", "prefill"),
            ("dcp_size", "4"),
            ("disaggregation_transfer_backend", "mooncake_tcp"),
            ("disaggregation_bootstrap_port", "9000"),
        ];
        let env = MapEnv::from_pairs(&[("SGLANG_RUST_SERVER", "1")]);
        let (kind, text, lines) = refused(&pairs, &env);
        assert_eq!((kind, text), (ErrorKind::ValueError, rust_server_port_conflict_error(9000, 30000)));
        assert_eq!(lines, [MOONCAKE_TCP_INFO, DCP_PREFILL_WARNING]);
    }

    #[test]
    fn refusal_keeps_the_radix_disabled_line() {
        let env = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        let pairs = [("disaggregation_mode", "decode"), ("disaggregation_transfer_backend", "mori")];
        let want = (ErrorKind::ValueError, staging_error("mori"), vec![RADIX_DISABLED_WARNING.to_owned()]);
        assert_eq!(refused(&pairs, &env), want);
        let pairs = [("disaggregation_mode", "decode"), ("enable_pd_role_switch", "1"), ("ep_size", "8")];
        let (_, text, lines) = refused(&pairs, &MapEnv::new());
        assert_eq!(text, role_switch_error(&["expert parallelism (--ep-size 8)".to_owned()]));
        assert_eq!(lines, [RADIX_DISABLED_WARNING]);
    }

    /// A variable's parse warning is a line too; a refusal before any line
    /// keeps none.
    #[test]
    fn refusal_keeps_parse_warnings_and_nothing_else() {
        let env = MapEnv::from_pairs(&[("SGLANG_RUST_SERVER", "maybe"), ("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        let pairs = [
            ("disaggregation_mode", "prefill"),
            ("disaggregation_transfer_backend", "nixl"),
            ("enable_pd_role_switch", "1"),
            ("speculative_algorithm", "EAGLE"),
        ];
        let (_, text, lines) = refused(&pairs, &env);
        assert_eq!(text, role_switch_error(&["speculative decoding (--speculative-algorithm EAGLE)".to_owned()]));
        assert_eq!(
            lines,
            ["Invalid value for SGLANG_RUST_SERVER: \"maybe\" is not a valid boolean value, using default \"False\""]
        );
        let (_, text, lines) = refused(&[("disaggregation_decode_host_receive_threshold", "nan")], &MapEnv::new());
        assert_eq!((text.as_str(), lines.len()), (HOST_RECEIVE_RANGE, 0));
    }

    #[test]
    fn latest_is_2026_10() {
        let mut a = ServerArgs::default();
        a.set("pdx_rules", Some("latest")).unwrap();
        assert_eq!(a.pdx_rules, RuleSet::Upstream202610);
    }
}
