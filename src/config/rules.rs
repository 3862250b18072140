//! SGLang's `handle_pd_disaggregation` hook in two versions, and
//! [`normalize`], which runs it together with load-balance defaulting.
//!
//! Texts are copied byte for byte from SGLang (commits 6076066e3 and
//! d4801be of `python/sglang/srt/server_args.py`); `docs/sglang-rules.md` lists them.

use super::args::{RuleSet, ServerArgs};
use super::env::{self, names, Env};
use super::load_balance::handle_load_balance_method;
use super::message::Message;
use super::py;
use crate::error::{Error, Result};

/// INFO line of the `mooncake_tcp` alias (always says `=1`).
pub const MOONCAKE_TCP_INFO: &str =
    "disaggregation transfer backend 'mooncake_tcp' -> mooncake with MC_FORCE_TCP=1 (TCP transport, no RDMA)";
/// ValueError: decode radix cache with HiSparse.
pub const RADIX_HISPARSE: &str = "--disaggregation-decode-enable-radix-cache is incompatible with --enable-hisparse";
/// ValueError (2026-07 rules): decode radix cache with the fake backend.
pub const RADIX_FAKE: &str =
    "--disaggregation-decode-enable-radix-cache is incompatible with --disaggregation-transfer-backend fake";
/// WARNING: decode radix cache with DP attention.
pub const RADIX_DP_WARNING: &str =
    "EXPERIMENTAL: Decode radix cache with DP attention. Requires prefix-aware DP rank routing for optimal cache hits.";
/// WARNING: decode radix cache enabled.
pub const RADIX_ENABLED_WARNING: &str = "EXPERIMENTAL: Radix cache is enabled for decode server";
/// WARNING: decode forced to chunk cache.
pub const CHUNK_CACHE_WARNING: &str = "KV cache is forced as chunk cache for decode server";
/// WARNING (default rules): mamba `extra_buffer` fallback.
pub const MAMBA_FALLBACK_WARNING: &str =
    "Mamba extra_buffer is disabled because decode disaggregation currently forces chunk cache. Falling back to no_buffer.";
/// AssertionError: prefill with the fake backend.
pub const PREFILL_FAKE: &str = "Prefill server does not support 'fake' as the transfer backend";

/// ValueError (default rules): decode radix cache needs nixl or mooncake.
pub fn radix_backend_whitelist_error(backend: &str) -> String {
    format!(
        "--disaggregation-decode-enable-radix-cache currently requires --disaggregation-transfer-backend in ('nixl', 'mooncake'), but got {}",
        py::repr_str(backend)
    )
}

/// ValueError: decode radix cache with speculative decoding.
pub fn radix_speculative_error(algorithm: &str) -> String {
    format!("--disaggregation-decode-enable-radix-cache is incompatible with speculative decoding (--speculative-algorithm {algorithm})")
}

/// ValueError: staging buffer with a backend other than mooncake/nixl.
pub fn staging_error(backend: &str) -> String {
    format!(
        "SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' or 'nixl', got '{backend}'."
    )
}

/// What the hook did besides mutating the arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HookOutcome {
    /// Log lines in emission order.
    pub messages: Vec<Message>,
    /// The `mooncake_tcp` alias applied: `MC_FORCE_TCP` must be
    /// set-defaulted to `"1"`. [`handle_pd_disaggregation`] does not write
    /// the environment itself; [`normalize`] does, after every rule passed.
    pub set_default_mc_force_tcp: bool,
}

/// `handle_pd_disaggregation(server_args)` under `rules`, reading the
/// environment through `env`. Mutates `args` in place (also on error, as
/// SGLang does; [`normalize`] works on a copy).
pub fn handle_pd_disaggregation(args: &mut ServerArgs, env: &dyn Env, rules: RuleSet) -> Result<HookOutcome> {
    let mut out = HookOutcome::default();

    // Step 1: the alias, in every mode.
    if args.disaggregation_transfer_backend == "mooncake_tcp" {
        out.set_default_mc_force_tcp = true;
        args.disaggregation_transfer_backend = "mooncake".into();
        args.disaggregation_ib_device = None;
        out.messages.push(Message::info(MOONCAKE_TCP_INFO));
    }

    match args.disaggregation_mode.as_str() {
        "decode" => {
            if args.disaggregation_decode_enable_radix_cache {
                if args.enable_hisparse {
                    return Err(Error::value_error(RADIX_HISPARSE));
                }
                let backend = args.disaggregation_transfer_backend.as_str();
                match rules {
                    RuleSet::Pr26346 if backend != "nixl" && backend != "mooncake" => {
                        return Err(Error::value_error(radix_backend_whitelist_error(backend)));
                    }
                    RuleSet::Upstream202607 if backend == "fake" => return Err(Error::value_error(RADIX_FAKE)),
                    _ => {}
                }
                if let Some(alg) = &args.speculative_algorithm {
                    return Err(Error::value_error(radix_speculative_error(alg)));
                }
                if args.enable_dp_attention {
                    out.messages.push(Message::warning(RADIX_DP_WARNING));
                }
                args.disable_radix_cache = false;
                out.messages.push(Message::warning(RADIX_ENABLED_WARNING));
            } else {
                args.disable_radix_cache = true;
                out.messages.push(Message::warning(CHUNK_CACHE_WARNING));
                if rules == RuleSet::Pr26346 && args.mamba_scheduler_strategy == "extra_buffer" {
                    out.messages.push(Message::warning(MAMBA_FALLBACK_WARNING));
                    args.mamba_scheduler_strategy = "no_buffer".into();
                }
            }
            if rules == RuleSet::Upstream202607 && args.disaggregation_decode_extra_slots.is_none() {
                args.disaggregation_decode_extra_slots =
                    Some(default_extra_slots(args.max_running_requests, args.dp_size));
            }
        }
        "prefill" => {
            if args.disaggregation_transfer_backend == "fake" {
                return Err(Error::assertion_error(PREFILL_FAKE));
            }
            if rules == RuleSet::Pr26346 {
                args.disable_cuda_graph = true;
            }
        }
        _ => {}
    }

    if matches!(args.disaggregation_mode.as_str(), "prefill" | "decode") {
        let staging = env::get_bool(env, names::SGLANG_DISAGG_STAGING_BUFFER, false);
        out.messages.extend(staging.warning.map(Message::warning));
        let backend = args.disaggregation_transfer_backend.as_str();
        if staging.value && backend != "mooncake" && backend != "nixl" {
            return Err(Error::value_error(staging_error(backend)));
        }
    }
    Ok(out)
}

/// The 2026-07 default for `disaggregation_decode_extra_slots`: 0 without
/// `max_running_requests`; else `per_worker = mrr // max(1, dp_size)`
/// (floor division) and `2 * per_worker` when `per_worker <= 32`, else 0.
pub fn default_extra_slots(max_running_requests: Option<i64>, dp_size: i64) -> i64 {
    let Some(mrr) = max_running_requests else { return 0 };
    let per_worker = mrr.div_euclid(dp_size.max(1));
    if per_worker <= 32 {
        per_worker.saturating_mul(2)
    } else {
        0
    }
}

/// Apply `os.environ.setdefault("MC_FORCE_TCP", "1")` through `env` and
/// describe what happened.
pub fn set_default_mc_force_tcp(env: &dyn Env) -> Message {
    match env.set_default(names::MC_FORCE_TCP, "1") {
        None => Message::info("MC_FORCE_TCP=1 set in the process environment (it was unset)"),
        Some(v) if v == "1" => Message::info("MC_FORCE_TCP is already set to \"1\"; kept (setdefault)"),
        Some(v) => Message::warning(format!(
            "MC_FORCE_TCP is already set to {v:?}; kept (setdefault). Mooncake still forces TCP because the variable is present, but SGLang's engine skips IB device selection only when it is exactly \"1\""
        )),
    }
}

/// Normalize `args` as SGLang's `ServerArgs.__post_init__` would for the
/// PD arguments, under `args.pdx_rules`:
///
/// - default rules: `_handle_load_balance_method`, then the hook (PR-time order);
/// - `2026-07`: the hook, then `_handle_load_balance_method`.
///
/// All-or-nothing: the rules run on a copy; on error `args` and the
/// environment are unchanged and nothing is logged. On success `args` is
/// replaced, `MC_FORCE_TCP` is set-defaulted through `env` when the
/// `mooncake_tcp` alias applied (a message, first in the list, says what
/// happened), every message is logged, and the messages are returned.
pub fn normalize(args: &mut ServerArgs, env: &dyn Env) -> Result<Vec<Message>> {
    let mut work = args.clone();
    let outcome = match work.pdx_rules {
        RuleSet::Pr26346 => {
            handle_load_balance_method(&mut work)?;
            handle_pd_disaggregation(&mut work, env, RuleSet::Pr26346)?
        }
        RuleSet::Upstream202607 => {
            let o = handle_pd_disaggregation(&mut work, env, RuleSet::Upstream202607)?;
            handle_load_balance_method(&mut work)?;
            o
        }
    };
    let mut messages = Vec::with_capacity(outcome.messages.len() + 1);
    if outcome.set_default_mc_force_tcp {
        messages.push(set_default_mc_force_tcp(env));
    }
    messages.extend(outcome.messages);
    for m in &messages {
        m.log();
    }
    *args = work;
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::MapEnv;
    use crate::config::message::Level;
    use crate::error::ErrorKind;

    const BOTH: [RuleSet; 2] = [RuleSet::Pr26346, RuleSet::Upstream202607];

    fn args(rules: RuleSet, pairs: &[(&str, &str)]) -> ServerArgs {
        let mut a = ServerArgs { pdx_rules: rules, ..Default::default() };
        for (k, v) in pairs {
            a.set(k, Some(v)).unwrap();
        }
        a
    }

    fn texts(messages: &[Message]) -> Vec<&str> {
        messages.iter().map(|m| m.text.as_str()).collect()
    }

    #[test]
    fn alias_in_every_mode_sets_env_once_and_clears_ib_device() {
        for rules in BOTH {
            for mode in ["null", "prefill", "decode"] {
                let env = MapEnv::new();
                let mut a = args(
                    rules,
                    &[
                        ("disaggregation_mode", mode),
                        ("disaggregation_transfer_backend", "mooncake_tcp"),
                        ("disaggregation_ib_device", "mlx5_0"),
                    ],
                );
                let msgs = normalize(&mut a, &env).unwrap();
                assert_eq!(a.disaggregation_transfer_backend, "mooncake");
                assert_eq!(a.disaggregation_ib_device, None);
                assert_eq!(env.var("MC_FORCE_TCP").as_deref(), Some("1"), "{mode}");
                assert_eq!(msgs[0], Message::info("MC_FORCE_TCP=1 set in the process environment (it was unset)"));
                assert_eq!(msgs[1], Message::info(MOONCAKE_TCP_INFO));
            }
        }
    }

    #[test]
    fn alias_keeps_existing_mc_force_tcp_setdefault() {
        for existing in ["0", "", "1"] {
            let env = MapEnv::from_pairs(&[("MC_FORCE_TCP", existing)]);
            let mut a = args(RuleSet::Pr26346, &[("disaggregation_transfer_backend", "mooncake_tcp")]);
            let msgs = normalize(&mut a, &env).unwrap();
            assert_eq!(env.var("MC_FORCE_TCP").as_deref(), Some(existing));
            // The SGLang line always says =1.
            assert_eq!(msgs[1].text, MOONCAKE_TCP_INFO);
            if existing == "1" {
                assert_eq!(msgs[0], Message::info("MC_FORCE_TCP is already set to \"1\"; kept (setdefault)"));
            } else {
                assert_eq!(msgs[0].level, Level::Warning);
                assert!(msgs[0]
                    .text
                    .starts_with(&format!("MC_FORCE_TCP is already set to {existing:?}; kept (setdefault).")));
            }
        }
    }

    #[test]
    fn no_alias_no_env_write() {
        let env = MapEnv::new();
        let mut a = args(RuleSet::Pr26346, &[("disaggregation_mode", "prefill")]);
        let msgs = normalize(&mut a, &env).unwrap();
        assert_eq!(env.var("MC_FORCE_TCP"), None);
        assert!(msgs.is_empty());
    }

    // Ported from SGLang's TestLoadBalanceMethod (rules as at each commit).
    #[test]
    fn radix_cache_rejects_hisparse() {
        for rules in BOTH {
            let mut a = args(
                rules,
                &[
                    ("disaggregation_mode", "decode"),
                    ("disaggregation_transfer_backend", "nixl"),
                    ("disaggregation_decode_enable_radix_cache", "true"),
                    ("enable_hisparse", "true"),
                ],
            );
            let e = normalize(&mut a, &MapEnv::new()).unwrap_err();
            assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, RADIX_HISPARSE));
        }
    }

    #[test]
    fn radix_cache_rejects_fake_backend() {
        let pairs = [
            ("disaggregation_mode", "decode"),
            ("disaggregation_transfer_backend", "fake"),
            ("disaggregation_decode_enable_radix_cache", "1"),
        ];
        let e = normalize(&mut args(RuleSet::Upstream202607, &pairs), &MapEnv::new()).unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, RADIX_FAKE));
        let e = normalize(&mut args(RuleSet::Pr26346, &pairs), &MapEnv::new()).unwrap_err();
        assert_eq!(
            e.message(),
            "--disaggregation-decode-enable-radix-cache currently requires --disaggregation-transfer-backend in ('nixl', 'mooncake'), but got 'fake'"
        );
    }

    #[test]
    fn radix_whitelist_only_in_default_rules() {
        let pairs = [
            ("disaggregation_mode", "decode"),
            ("disaggregation_transfer_backend", "mori"),
            ("disaggregation_decode_enable_radix_cache", "1"),
        ];
        let e = normalize(&mut args(RuleSet::Pr26346, &pairs), &MapEnv::new()).unwrap_err();
        assert_eq!(e.message(), radix_backend_whitelist_error("mori"));
        let mut a = args(RuleSet::Upstream202607, &pairs);
        normalize(&mut a, &MapEnv::new()).unwrap();
        assert!(!a.disable_radix_cache);
    }

    #[test]
    fn radix_cache_allows_mooncake_tcp() {
        for rules in BOTH {
            let env = MapEnv::new();
            let mut a = args(
                rules,
                &[
                    ("disaggregation_mode", "decode"),
                    ("disaggregation_transfer_backend", "mooncake_tcp"),
                    ("disaggregation_decode_enable_radix_cache", "true"),
                    ("disable_radix_cache", "true"),
                ],
            );
            let msgs = normalize(&mut a, &env).unwrap();
            assert!(!a.disable_radix_cache);
            assert_eq!(a.disaggregation_transfer_backend, "mooncake");
            assert_eq!(env.var("MC_FORCE_TCP").as_deref(), Some("1"));
            assert_eq!(&texts(&msgs)[1..], [MOONCAKE_TCP_INFO, RADIX_ENABLED_WARNING]);
            assert_eq!(a.load_balance_method, "round_robin");
        }
    }

    #[test]
    fn radix_cache_rejects_speculative_after_backend_check() {
        for rules in BOTH {
            let mut a = args(
                rules,
                &[
                    ("disaggregation_mode", "decode"),
                    ("disaggregation_decode_enable_radix_cache", "true"),
                    ("speculative_algorithm", "EAGLE"),
                ],
            );
            let e = normalize(&mut a, &MapEnv::new()).unwrap_err();
            assert_eq!(
                e.message(),
                "--disaggregation-decode-enable-radix-cache is incompatible with speculative decoding (--speculative-algorithm EAGLE)"
            );
        }
    }

    #[test]
    fn radix_dp_attention_warning_comes_first() {
        let mut a = args(
            RuleSet::Pr26346,
            &[
                ("disaggregation_mode", "decode"),
                ("disaggregation_decode_enable_radix_cache", "true"),
                ("enable_dp_attention", "true"),
            ],
        );
        let msgs = normalize(&mut a, &MapEnv::new()).unwrap();
        assert_eq!(texts(&msgs), [RADIX_DP_WARNING, RADIX_ENABLED_WARNING]);
        assert!(msgs.iter().all(|m| m.level == Level::Warning));
    }

    #[test]
    fn decode_without_radix_forces_chunk_cache_and_mamba_fallback_by_rule_set() {
        let pairs = [("disaggregation_mode", "decode"), ("mamba_scheduler_strategy", "extra_buffer")];
        let mut a = args(RuleSet::Pr26346, &pairs);
        let msgs = normalize(&mut a, &MapEnv::new()).unwrap();
        assert!(a.disable_radix_cache);
        assert_eq!(a.mamba_scheduler_strategy, "no_buffer");
        assert_eq!(texts(&msgs), [CHUNK_CACHE_WARNING, MAMBA_FALLBACK_WARNING]);

        let mut a = args(RuleSet::Upstream202607, &pairs);
        let msgs = normalize(&mut a, &MapEnv::new()).unwrap();
        assert!(a.disable_radix_cache);
        assert_eq!(a.mamba_scheduler_strategy, "extra_buffer");
        assert_eq!(texts(&msgs), [CHUNK_CACHE_WARNING]);
    }

    #[test]
    fn extra_slots_math() {
        assert_eq!(default_extra_slots(None, 1), 0);
        assert_eq!(default_extra_slots(Some(64), 2), 64);
        assert_eq!(default_extra_slots(Some(64), 1), 0);
        assert_eq!(default_extra_slots(Some(1), 4), 0);
        assert_eq!(default_extra_slots(Some(32), 0), 64);
        assert_eq!(default_extra_slots(Some(33), 1), 0);
        assert_eq!(default_extra_slots(Some(-3), 2), -4, "Python floor division: -3 // 2 == -2");
    }

    #[test]
    fn extra_slots_defaulted_only_in_2026_07_decode_and_only_when_none() {
        let decode = [("disaggregation_mode", "decode"), ("max_running_requests", "64"), ("dp_size", "2")];
        let mut a = args(RuleSet::Upstream202607, &decode);
        normalize(&mut a, &MapEnv::new()).unwrap();
        assert_eq!(a.disaggregation_decode_extra_slots, Some(64));

        let mut a = args(RuleSet::Upstream202607, &decode);
        a.set("disaggregation_decode_extra_slots", Some("0")).unwrap();
        normalize(&mut a, &MapEnv::new()).unwrap();
        assert_eq!(a.disaggregation_decode_extra_slots, Some(0));

        let mut a = args(RuleSet::Upstream202607, &[("disaggregation_mode", "decode")]);
        normalize(&mut a, &MapEnv::new()).unwrap();
        assert_eq!(a.disaggregation_decode_extra_slots, Some(0));

        for (rules, mode) in [(RuleSet::Pr26346, "decode"), (RuleSet::Upstream202607, "prefill")] {
            let mut a = args(rules, &[("disaggregation_mode", mode), ("max_running_requests", "8")]);
            normalize(&mut a, &MapEnv::new()).unwrap();
            assert_eq!(a.disaggregation_decode_extra_slots, None);
        }
    }

    #[test]
    fn prefill_fake_is_an_assertion_error() {
        for rules in BOTH {
            let mut a = args(rules, &[("disaggregation_mode", "prefill"), ("disaggregation_transfer_backend", "fake")]);
            let before = a.clone();
            let e = normalize(&mut a, &MapEnv::new()).unwrap_err();
            assert_eq!((e.kind(), e.message()), (ErrorKind::AssertionError, PREFILL_FAKE));
            assert_eq!(a, before, "normalize is all-or-nothing");
        }
        // fake is fine for null and for decode without radix.
        for mode in ["null", "decode"] {
            normalize(
                &mut args(
                    RuleSet::Pr26346,
                    &[("disaggregation_mode", mode), ("disaggregation_transfer_backend", "fake")],
                ),
                &MapEnv::new(),
            )
            .unwrap();
        }
    }

    #[test]
    fn prefill_disable_cuda_graph_only_in_default_rules() {
        let mut a = args(RuleSet::Pr26346, &[("disaggregation_mode", "prefill")]);
        normalize(&mut a, &MapEnv::new()).unwrap();
        assert!(a.disable_cuda_graph);
        assert_eq!(a.load_balance_method, "follow_bootstrap_room");
        let mut a = args(RuleSet::Upstream202607, &[("disaggregation_mode", "prefill")]);
        normalize(&mut a, &MapEnv::new()).unwrap();
        assert!(!a.disable_cuda_graph);
    }

    #[test]
    fn staging_check() {
        let on = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        for rules in BOTH {
            for mode in ["prefill", "decode"] {
                let e = normalize(
                    &mut args(rules, &[("disaggregation_mode", mode), ("disaggregation_transfer_backend", "mori")]),
                    &on,
                )
                .unwrap_err();
                assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, "SGLANG_DISAGG_STAGING_BUFFER requires disaggregation_transfer_backend='mooncake' or 'nixl', got 'mori'."));
                for ok in ["mooncake", "nixl", "mooncake_tcp"] {
                    normalize(
                        &mut args(rules, &[("disaggregation_mode", mode), ("disaggregation_transfer_backend", ok)]),
                        &on,
                    )
                    .unwrap();
                }
            }
            // Mode null: no staging check.
            normalize(&mut args(rules, &[("disaggregation_transfer_backend", "mori")]), &on).unwrap();
        }
        let off = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", "no")]);
        normalize(
            &mut args(
                RuleSet::Pr26346,
                &[("disaggregation_mode", "decode"), ("disaggregation_transfer_backend", "mori")],
            ),
            &off,
        )
        .unwrap();
    }

    #[test]
    fn staging_env_invalid_value_warns_and_defaults_off() {
        let env = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", " true")]);
        let mut a =
            args(RuleSet::Pr26346, &[("disaggregation_mode", "prefill"), ("disaggregation_transfer_backend", "mori")]);
        let msgs = normalize(&mut a, &env).unwrap();
        assert_eq!(
            msgs,
            vec![Message::warning("Invalid value for SGLANG_DISAGG_STAGING_BUFFER: \" true\" is not a valid boolean value, using default \"False\"")]
        );
    }

    #[test]
    fn failed_normalize_leaves_env_untouched() {
        let env = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        let mut a = args(
            RuleSet::Pr26346,
            &[
                ("disaggregation_mode", "decode"),
                ("disaggregation_transfer_backend", "mooncake_tcp"),
                ("disaggregation_decode_enable_radix_cache", "true"),
                ("enable_hisparse", "true"),
            ],
        );
        assert!(normalize(&mut a, &env).is_err());
        assert_eq!(env.var("MC_FORCE_TCP"), None);
        assert_eq!(a.disaggregation_transfer_backend, "mooncake_tcp");
    }

    #[test]
    fn invalid_mode_from_rust_callers() {
        for rules in BOTH {
            let mut a = ServerArgs { pdx_rules: rules, disaggregation_mode: "both".into(), ..Default::default() };
            let e = normalize(&mut a, &MapEnv::new()).unwrap_err();
            assert_eq!(e.message(), "Invalid disaggregation_mode='both'");
        }
    }

    #[test]
    fn normalize_twice_is_stable() {
        let env = MapEnv::new();
        let mut a = args(
            RuleSet::Pr26346,
            &[("disaggregation_mode", "decode"), ("disaggregation_transfer_backend", "mooncake_tcp")],
        );
        normalize(&mut a, &env).unwrap();
        let once = a.clone();
        let msgs = normalize(&mut a, &env).unwrap();
        assert_eq!(a, once);
        assert_eq!(texts(&msgs), [CHUNK_CACHE_WARNING]);
    }
}
