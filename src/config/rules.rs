//! SGLang's `handle_pd_disaggregation` hook in three versions (the fourth,
//! `2026-10`, is [`super::rules_2026_10`]), and [`normalize`], which runs it together with load-balance defaulting.
//!
//! Texts are copied byte for byte from SGLang (commits 6076066e3 and
//! d4801be of `python/sglang/srt/server_args.py`; for `2026-09`,
//! `python/sglang/srt/arg_groups/pd_disaggregation_hook.py` as at
//! zihanlin-ai/sglang@77e0052); `docs/sglang-rules.md` lists them.

use super::args::{RuleSet, ServerArgs, DEFAULT_BOOTSTRAP_PORT};
use super::env::{self, names, Env};
pub use super::hook_texts::*;
use super::load_balance::handle_load_balance_method;
use super::message::Message;
use super::rules_2026_10;
use crate::error::{Error, Result};

/// `handle_pd_disaggregation(server_args)` under `rules`, reading the
/// environment through `env`. Mutates `args` in place (also on error, as
/// SGLang does; [`normalize`] works on a copy) and appends to `out` as SGLang
/// logs, so that on error `out` holds the lines logged before it.
pub fn handle_pd_disaggregation(
    args: &mut ServerArgs,
    env: &dyn Env,
    rules: RuleSet,
    out: &mut HookOutcome,
) -> Result<()> {
    if rules == RuleSet::Upstream202610 {
        return rules_2026_10::handle_pd_disaggregation(args, env, out);
    }

    // Step 1: the alias, in every mode.
    if args.disaggregation_transfer_backend == "mooncake_tcp" {
        out.set_default_mc_force_tcp = true;
        args.disaggregation_transfer_backend = "mooncake".into();
        args.disaggregation_ib_device = None;
        out.messages.push(Message::info(MOONCAKE_TCP_INFO));
    }

    if rules == RuleSet::Upstream202609 {
        decode_context_parallel(args, out)?;
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
                    RuleSet::Upstream202607 | RuleSet::Upstream202609 if backend == "fake" => {
                        return Err(Error::value_error(RADIX_FAKE));
                    }
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
            if rules != RuleSet::Pr26346 && args.disaggregation_decode_extra_slots.is_none() {
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
            if rules == RuleSet::Upstream202609 {
                let rust_server = env::get_bool(env, names::SGLANG_RUST_SERVER, false);
                out.messages.extend(rust_server.warning.map(Message::warning));
                if rust_server.value {
                    alias_bootstrap_port_to_api_port(args, out)?;
                }
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
    Ok(())
}

/// The 2026-09 decode-context-parallel rules, run right after the alias:
/// a prefill with `dcp_size > 1` gets a warning; a decode with
/// `dcp_size > 1` needs mooncake, nixl or fake, then chunk cache (no decode
/// radix cache), then no HiCache, in that order.
fn decode_context_parallel(args: &ServerArgs, out: &mut HookOutcome) -> Result<()> {
    if args.dcp_size <= 1 {
        return Ok(());
    }
    match args.disaggregation_mode.as_str() {
        "prefill" => out.messages.push(Message::warning(DCP_PREFILL_WARNING)),
        "decode" => {
            let backend = args.disaggregation_transfer_backend.as_str();
            if !matches!(backend, "mooncake" | "nixl" | "fake") {
                return Err(Error::value_error(dcp_backend_error(backend)));
            }
            if args.disaggregation_decode_enable_radix_cache {
                return Err(Error::value_error(DCP_RADIX));
            }
            if args.enable_hierarchical_cache {
                return Err(Error::value_error(DCP_HIERARCHICAL_CACHE));
            }
        }
        _ => {}
    }
    Ok(())
}

/// SGLang's `_alias_bootstrap_port_to_api_port` (prefill, `SGLANG_RUST_SERVER`
/// true): the Rust server serves the bootstrap registry on the api port, so
/// a bootstrap port that is neither SGLang's default nor `port` is refused;
/// one that differs from `port` becomes `port`, with an info line.
fn alias_bootstrap_port_to_api_port(args: &mut ServerArgs, out: &mut HookOutcome) -> Result<()> {
    let (bootstrap_port, port) = (args.disaggregation_bootstrap_port, args.port);
    if bootstrap_port != DEFAULT_BOOTSTRAP_PORT && bootstrap_port != port {
        return Err(Error::value_error(rust_server_port_conflict_error(bootstrap_port, port)));
    }
    if bootstrap_port != port {
        out.messages.push(Message::info(rust_server_port_info(bootstrap_port, port)));
        args.disaggregation_bootstrap_port = port;
    }
    Ok(())
}

/// The 2026-07 (and 2026-09) default for `disaggregation_decode_extra_slots`: 0 without
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
/// - `2026-07` and `2026-09`: the hook, then `_handle_load_balance_method`;
/// - `2026-10`: sglang 0.5.23's pipeline ([`rules_2026_10::resolve`]).
///
/// The rules run on a copy. On success `args` is replaced,
/// `MC_FORCE_TCP` is set-defaulted through `env` when the `mooncake_tcp`
/// alias applied (a message, first in the list, says what happened), every
/// message is logged, and the messages are returned.
///
/// On error `args` and the environment are unchanged, and the [`Refusal`]
/// holds SGLang's error with the lines SGLang logged before raising it
/// (logged here too, as SGLang logs them): the `mooncake_tcp` rewrite's line,
/// a decode server's radix-cache line, the DCP note, a variable's parse
/// warning, ... in SGLang's order.
pub fn normalize(args: &mut ServerArgs, env: &dyn Env) -> std::result::Result<Vec<Message>, Refusal> {
    let mut work = args.clone();
    let mut outcome = HookOutcome::default();
    let ran = match work.pdx_rules {
        RuleSet::Upstream202610 => rules_2026_10::resolve(&mut work, env, &mut outcome),
        RuleSet::Pr26346 => handle_load_balance_method(&mut work)
            .and_then(|()| handle_pd_disaggregation(&mut work, env, RuleSet::Pr26346, &mut outcome)),
        rules @ (RuleSet::Upstream202607 | RuleSet::Upstream202609) => {
            handle_pd_disaggregation(&mut work, env, rules, &mut outcome)
                .and_then(|()| handle_load_balance_method(&mut work))
        }
    };
    if let Err(error) = ran {
        for m in &outcome.messages {
            m.log();
        }
        return Err(Refusal { error, messages: outcome.messages });
    }
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
    use crate::config::choices;
    use crate::config::env::MapEnv;
    use crate::config::message::Level;
    use crate::error::ErrorKind;

    const BOTH: [RuleSet; 2] = [RuleSet::Pr26346, RuleSet::Upstream202607];
    const ALL: [RuleSet; 3] = [RuleSet::Pr26346, RuleSet::Upstream202607, RuleSet::Upstream202609];
    const SEP: RuleSet = RuleSet::Upstream202609;

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
        for rules in ALL {
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
        for rules in ALL {
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
        for rules in ALL {
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
        for rules in ALL {
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
        for rules in ALL {
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
        for rules in ALL {
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

    /// normalize's refusal, after checking that it changed neither the
    /// arguments nor the environment: (kind, text, lines before it).
    fn refused(rules: RuleSet, pairs: &[(&str, &str)], env: &MapEnv) -> (ErrorKind, String, Vec<String>) {
        let mut a = args(rules, pairs);
        let before = a.clone();
        let mc_force_tcp = env.var("MC_FORCE_TCP");
        let r = normalize(&mut a, env).unwrap_err();
        assert_eq!(a, before, "{rules:?} {pairs:?}: the arguments changed");
        assert_eq!(env.var("MC_FORCE_TCP"), mc_force_tcp, "{rules:?} {pairs:?}: the environment changed");
        (r.kind(), r.message().to_owned(), r.messages.iter().map(|m| m.text.clone()).collect())
    }

    /// SGLang logs the alias's line, then raises: the line is kept (pdx's
    /// own MC_FORCE_TCP line is not, the variable stays unset).
    #[test]
    fn refusal_keeps_the_alias_line_logged_before_it() {
        let radix_hisparse = [
            ("disaggregation_mode", "decode"),
            ("disaggregation_transfer_backend", "mooncake_tcp"),
            ("disaggregation_decode_enable_radix_cache", "true"),
            ("enable_hisparse", "true"),
        ];
        for rules in ALL {
            let got = refused(rules, &radix_hisparse, &MapEnv::new());
            assert_eq!(got, (ErrorKind::ValueError, RADIX_HISPARSE.to_owned(), vec![MOONCAKE_TCP_INFO.to_owned()]));
        }
        let alias = [("disaggregation_transfer_backend", "mooncake_tcp")];
        let mut a = ServerArgs { disaggregation_mode: "both".into(), ..args(RuleSet::Upstream202607, &alias) };
        let r = normalize(&mut a, &MapEnv::new()).unwrap_err();
        // 2026-07 runs the hook before load balancing (the line, then the
        // error); the PR-time order is the other way round.
        assert_eq!((r.message(), r.messages.len()), ("Invalid disaggregation_mode='both'", 1));
        a.pdx_rules = RuleSet::Pr26346;
        assert!(normalize(&mut a, &MapEnv::new()).unwrap_err().messages.is_empty());
    }

    /// The decode branch's lines come before the staging check's refusal,
    /// with each rule set's own texts.
    #[test]
    fn refusal_keeps_the_decode_lines_logged_before_it() {
        let staging = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        let mori = [("disaggregation_mode", "decode"), ("disaggregation_transfer_backend", "mori")];
        for rules in ALL {
            let got = refused(rules, &mori, &staging);
            assert_eq!(got, (ErrorKind::ValueError, staging_error("mori"), vec![CHUNK_CACHE_WARNING.to_owned()]));
        }
        let mamba = [
            ("disaggregation_mode", "decode"),
            ("disaggregation_transfer_backend", "mori"),
            ("mamba_scheduler_strategy", "extra_buffer"),
        ];
        let (_, _, lines) = refused(RuleSet::Pr26346, &mamba, &staging);
        assert_eq!(lines, [CHUNK_CACHE_WARNING, MAMBA_FALLBACK_WARNING]);
        let radix_dp = [
            ("disaggregation_mode", "decode"),
            ("disaggregation_transfer_backend", "mori"),
            ("disaggregation_decode_enable_radix_cache", "true"),
            ("enable_dp_attention", "true"),
        ];
        for rules in [RuleSet::Upstream202607, SEP] {
            let (_, text, lines) = refused(rules, &radix_dp, &staging);
            assert_eq!(
                (text, lines),
                (staging_error("mori"), vec![RADIX_DP_WARNING.to_owned(), RADIX_ENABLED_WARNING.to_owned()])
            );
        }
    }

    /// 2026-09: the DCP note and a variable's parse warning are logged
    /// before a later refusal; a refusal before any line keeps none.
    #[test]
    fn refusal_keeps_the_2026_09_lines_logged_before_it() {
        let pairs = [
            ("disaggregation_mode", "prefill"),
            ("dcp_size", "2"),
            ("disaggregation_transfer_backend", "mooncake_tcp"),
            ("disaggregation_bootstrap_port", "9000"),
        ];
        let (kind, text, lines) = refused(SEP, &pairs, &rust_env("1"));
        assert_eq!((kind, text), value_error(&rust_server_port_conflict_error(9000, 30000)));
        assert_eq!(lines, [MOONCAKE_TCP_INFO, DCP_PREFILL_WARNING]);
        let env = MapEnv::from_pairs(&[("SGLANG_RUST_SERVER", "maybe"), ("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        let (_, text, lines) =
            refused(SEP, &[("disaggregation_mode", "prefill"), ("disaggregation_transfer_backend", "mori")], &env);
        assert_eq!(text, staging_error("mori"));
        assert_eq!(
            lines,
            ["Invalid value for SGLANG_RUST_SERVER: \"maybe\" is not a valid boolean value, using default \"False\""]
        );
        for rules in ALL {
            let got = refused(
                rules,
                &[("disaggregation_mode", "prefill"), ("disaggregation_transfer_backend", "fake")],
                &MapEnv::new(),
            );
            assert_eq!(got, (ErrorKind::AssertionError, PREFILL_FAKE.to_owned(), vec![]));
        }
    }

    #[test]
    fn invalid_mode_from_rust_callers() {
        for rules in ALL {
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

    // ---- 2026-09: decode context parallel (DCP) ----

    fn err(rules: RuleSet, pairs: &[(&str, &str)], env: &MapEnv) -> (ErrorKind, String) {
        let mut a = args(rules, pairs);
        let before = a.clone();
        let e = normalize(&mut a, env).unwrap_err();
        assert_eq!(a, before, "normalize is all-or-nothing");
        (e.kind(), e.message().to_owned())
    }

    fn value_error(text: &str) -> (ErrorKind, String) {
        (ErrorKind::ValueError, text.to_owned())
    }

    #[test]
    fn dcp_texts_are_sglangs() {
        assert_eq!(
            DCP_PREFILL_WARNING,
            "DCP on a PD prefill server is supported when prefill and decode use the same DCP layout, but it usually adds communication overhead without improving prefill performance."
        );
        assert_eq!(
            dcp_backend_error("mori"),
            "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, or fake for synthetic benchmarking, got 'mori'."
        );
        // Python's repr picks double quotes around a single quote.
        assert_eq!(
            dcp_backend_error("it's"),
            "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, or fake for synthetic benchmarking, got \"it's\"."
        );
        assert_eq!(
            DCP_RADIX,
            "PD decode DCP currently requires chunk cache; --disaggregation-decode-enable-radix-cache is not supported."
        );
        assert_eq!(
            DCP_HIERARCHICAL_CACHE,
            "PD decode DCP currently requires chunk cache; --enable-hierarchical-cache is not supported."
        );
    }

    #[test]
    fn dcp_prefill_warns_only_above_one() {
        for (dcp, warned) in [("2", true), ("8", true), ("1", false), ("0", false), ("-3", false)] {
            let mut a = args(SEP, &[("disaggregation_mode", "prefill"), ("dcp_size", dcp)]);
            let msgs = normalize(&mut a, &MapEnv::new()).unwrap();
            let want: &[Message] = if warned { &[Message::warning(DCP_PREFILL_WARNING)] } else { &[] };
            assert_eq!(msgs, want, "dcp_size={dcp}");
            assert_eq!(a.load_balance_method, "follow_bootstrap_room");
        }
    }

    #[test]
    fn dcp_decode_backends() {
        for ok in ["mooncake", "nixl", "fake"] {
            let mut a = args(
                SEP,
                &[("disaggregation_mode", "decode"), ("dcp_size", "4"), ("disaggregation_transfer_backend", ok)],
            );
            let msgs = normalize(&mut a, &MapEnv::new()).unwrap();
            assert!(a.disable_radix_cache, "{ok}: chunk cache forced as without DCP");
            assert_eq!(texts(&msgs), [CHUNK_CACHE_WARNING], "{ok}");
        }
        for bad in ["mori", "ascend"] {
            let pairs =
                [("disaggregation_mode", "decode"), ("dcp_size", "2"), ("disaggregation_transfer_backend", bad)];
            assert_eq!(err(SEP, &pairs, &MapEnv::new()), value_error(&dcp_backend_error(bad)));
        }
        choices::add_transfer_backend_choices(&["pdx_rules_dcp_plugin"]);
        let pairs = [
            ("disaggregation_mode", "decode"),
            ("dcp_size", "2"),
            ("disaggregation_transfer_backend", "pdx_rules_dcp_plugin"),
        ];
        assert_eq!(
            err(SEP, &pairs, &MapEnv::new()).1,
            "PD decode DCP requires --disaggregation-transfer-backend mooncake, nixl, or fake for synthetic benchmarking, got 'pdx_rules_dcp_plugin'."
        );
    }

    /// The alias runs first: `mooncake_tcp` is `mooncake` by the time the
    /// DCP backend check reads it.
    #[test]
    fn dcp_sees_the_alias_rewrite() {
        let env = MapEnv::new();
        let mut a = args(
            SEP,
            &[
                ("disaggregation_mode", "decode"),
                ("dcp_size", "2"),
                ("disaggregation_transfer_backend", "mooncake_tcp"),
            ],
        );
        let msgs = normalize(&mut a, &env).unwrap();
        assert_eq!(a.disaggregation_transfer_backend, "mooncake");
        assert_eq!(env.var("MC_FORCE_TCP").as_deref(), Some("1"));
        assert_eq!(&texts(&msgs)[1..], [MOONCAKE_TCP_INFO, CHUNK_CACHE_WARNING]);
    }

    #[test]
    fn dcp_decode_refuses_radix_cache_before_the_radix_rules() {
        // DCP's own text, not the radix branch's hisparse / fake / speculative ones.
        for extra in [("enable_hisparse", "true"), ("speculative_algorithm", "EAGLE"), ("dp_size", "1")] {
            for backend in ["nixl", "fake"] {
                let pairs = [
                    ("disaggregation_mode", "decode"),
                    ("dcp_size", "2"),
                    ("disaggregation_transfer_backend", backend),
                    ("disaggregation_decode_enable_radix_cache", "true"),
                    extra,
                ];
                assert_eq!(err(SEP, &pairs, &MapEnv::new()), value_error(DCP_RADIX), "{backend} {extra:?}");
            }
        }
    }

    #[test]
    fn dcp_decode_refuses_hierarchical_cache() {
        let pairs = [("disaggregation_mode", "decode"), ("dcp_size", "2"), ("enable_hierarchical_cache", "true")];
        assert_eq!(err(SEP, &pairs, &MapEnv::new()), value_error(DCP_HIERARCHICAL_CACHE));
        // Without DCP, or outside decode, HiCache is not this hook's business.
        for (mode, dcp) in [("decode", "1"), ("prefill", "2"), ("null", "2")] {
            let mut a =
                args(SEP, &[("disaggregation_mode", mode), ("dcp_size", dcp), ("enable_hierarchical_cache", "1")]);
            normalize(&mut a, &MapEnv::new()).unwrap();
        }
    }

    /// backend, then radix cache, then HiCache: each case breaks every
    /// later rule too, and the first one's text wins.
    #[test]
    fn dcp_decode_check_order() {
        let base = [("disaggregation_mode", "decode"), ("dcp_size", "2")];
        let all_bad = [
            ("disaggregation_transfer_backend", "mori"),
            ("disaggregation_decode_enable_radix_cache", "true"),
            ("enable_hierarchical_cache", "true"),
        ];
        let want = [dcp_backend_error("mori"), DCP_RADIX.to_owned(), DCP_HIERARCHICAL_CACHE.to_owned()];
        for (first, text) in want.iter().enumerate() {
            let pairs: Vec<(&str, &str)> = base.iter().chain(&all_bad[first..]).copied().collect();
            assert_eq!(err(SEP, &pairs, &MapEnv::new()), value_error(text), "{pairs:?}");
        }
        // Then the staging check of every rule set still follows.
        let staging = MapEnv::from_pairs(&[("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        let pairs = [("disaggregation_mode", "decode"), ("dcp_size", "2"), ("disaggregation_transfer_backend", "fake")];
        assert_eq!(err(SEP, &pairs, &staging), value_error(&staging_error("fake")));
    }

    #[test]
    fn dcp_null_mode_and_dcp_one_change_nothing() {
        let pairs = [
            ("dcp_size", "8"),
            ("disaggregation_transfer_backend", "mori"),
            ("disaggregation_decode_enable_radix_cache", "true"),
            ("enable_hierarchical_cache", "true"),
        ];
        let mut a = args(SEP, &pairs);
        assert!(normalize(&mut a, &MapEnv::new()).unwrap().is_empty());
        let mut a = args(
            SEP,
            &[("disaggregation_mode", "decode"), ("dcp_size", "1"), ("disaggregation_transfer_backend", "mori")],
        );
        normalize(&mut a, &MapEnv::new()).unwrap();
    }

    #[test]
    fn dcp_prefill_warning_then_fake_assertion() {
        let pairs =
            [("disaggregation_mode", "prefill"), ("dcp_size", "2"), ("disaggregation_transfer_backend", "fake")];
        let got = refused(SEP, &pairs, &MapEnv::new());
        assert_eq!(got, (ErrorKind::AssertionError, PREFILL_FAKE.to_owned(), vec![DCP_PREFILL_WARNING.to_owned()]));
    }

    // ---- 2026-09: SGLANG_RUST_SERVER ----

    fn rust_env(value: &str) -> MapEnv {
        MapEnv::from_pairs(&[("SGLANG_RUST_SERVER", value)])
    }

    #[test]
    fn rust_server_texts_are_sglangs() {
        assert_eq!(
            rust_server_port_conflict_error(9000, 30000),
            "SGLANG_RUST_SERVER serves the PD KV bootstrap registry on the api port itself; --disaggregation-bootstrap-port 9000 conflicts with --port 30000. Drop --disaggregation-bootstrap-port (decode nodes and the PD router must then target the prefill api port)."
        );
        assert_eq!(
            rust_server_port_info(8998, 30000),
            "SGLANG_RUST_SERVER: KV bootstrap registry is served on the api port; disaggregation_bootstrap_port 8998 -> 30000"
        );
    }

    #[test]
    fn rust_server_moves_the_default_bootstrap_port_to_the_api_port() {
        for on in ["1", "true", "TRUE", "yes", "Y"] {
            let mut a = args(SEP, &[("disaggregation_mode", "prefill")]);
            let msgs = normalize(&mut a, &rust_env(on)).unwrap();
            assert_eq!(a.disaggregation_bootstrap_port, 30000, "{on}");
            assert_eq!(msgs, vec![Message::info(rust_server_port_info(8998, 30000))]);
        }
        let mut a = args(SEP, &[("disaggregation_mode", "prefill"), ("port", "8000")]);
        let msgs = normalize(&mut a, &rust_env("1")).unwrap();
        assert_eq!((a.disaggregation_bootstrap_port, a.port), (8000, 8000));
        assert_eq!(texts(&msgs), ["SGLANG_RUST_SERVER: KV bootstrap registry is served on the api port; disaggregation_bootstrap_port 8998 -> 8000"]);
    }

    #[test]
    fn rust_server_equal_ports_log_nothing() {
        for (bp, port) in [("9000", "9000"), ("8998", "8998")] {
            let mut a =
                args(SEP, &[("disaggregation_mode", "prefill"), ("disaggregation_bootstrap_port", bp), ("port", port)]);
            let before = a.clone();
            let msgs = normalize(&mut a, &rust_env("true")).unwrap();
            assert!(msgs.is_empty(), "{bp}/{port}: {msgs:?}");
            assert_eq!(a.disaggregation_bootstrap_port, before.disaggregation_bootstrap_port);
        }
    }

    #[test]
    fn rust_server_refuses_an_explicit_other_bootstrap_port() {
        for (bp, port) in [(9000, 30000), (30000, 8998), (-1, 30000), (8999, 31000)] {
            let pairs = [
                ("disaggregation_mode", "prefill"),
                ("disaggregation_bootstrap_port", &*bp.to_string()),
                ("port", &*port.to_string()),
            ];
            let owned: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(
                err(SEP, &owned, &rust_env("1")),
                value_error(&rust_server_port_conflict_error(bp, port)),
                "{bp}/{port}"
            );
        }
    }

    #[test]
    fn rust_server_env_parsing() {
        // Off: unset or a false spelling; the port is left alone.
        for env in [MapEnv::new(), rust_env("0"), rust_env("false"), rust_env("No"), rust_env("n")] {
            let mut a = args(SEP, &[("disaggregation_mode", "prefill"), ("disaggregation_bootstrap_port", "9000")]);
            assert!(normalize(&mut a, &env).unwrap().is_empty());
            assert_eq!(a.disaggregation_bootstrap_port, 9000);
        }
        // Not a boolean: SGLang's warning and the default (off); no trimming.
        for (raw, lowered) in [("on", "on"), (" 1", " 1"), ("", ""), ("TRUE ", "true ")] {
            let mut a = args(SEP, &[("disaggregation_mode", "prefill"), ("disaggregation_bootstrap_port", "9000")]);
            let msgs = normalize(&mut a, &rust_env(raw)).unwrap();
            assert_eq!(
                msgs,
                vec![Message::warning(format!(
                    "Invalid value for SGLANG_RUST_SERVER: \"{lowered}\" is not a valid boolean value, using default \"False\""
                ))],
                "{raw:?}"
            );
            assert_eq!(a.disaggregation_bootstrap_port, 9000);
        }
    }

    #[test]
    fn rust_server_only_for_prefill() {
        for mode in ["decode", "null"] {
            let mut a = args(SEP, &[("disaggregation_mode", mode), ("disaggregation_bootstrap_port", "9000")]);
            let msgs = normalize(&mut a, &rust_env("on")).unwrap();
            assert_eq!(a.disaggregation_bootstrap_port, 9000, "{mode}");
            assert!(!texts(&msgs).iter().any(|t| t.contains("SGLANG_RUST_SERVER")), "{mode}: the variable is not read");
        }
    }

    /// Order in prefill: DCP warning, fake assertion, the Rust server's port
    /// rule, then the staging check.
    #[test]
    fn rust_server_order_in_prefill() {
        let conflict = [("disaggregation_mode", "prefill"), ("disaggregation_bootstrap_port", "9000")];
        let fake: Vec<(&str, &str)> =
            conflict.iter().copied().chain([("disaggregation_transfer_backend", "fake")]).collect();
        assert_eq!(err(SEP, &fake, &rust_env("1")), (ErrorKind::AssertionError, PREFILL_FAKE.to_owned()));

        let both = MapEnv::from_pairs(&[("SGLANG_RUST_SERVER", "1"), ("SGLANG_DISAGG_STAGING_BUFFER", "1")]);
        let mori: Vec<(&str, &str)> =
            conflict.iter().copied().chain([("disaggregation_transfer_backend", "mori")]).collect();
        assert_eq!(err(SEP, &mori, &both), value_error(&rust_server_port_conflict_error(9000, 30000)));
        let mori_default_port = [("disaggregation_mode", "prefill"), ("disaggregation_transfer_backend", "mori")];
        assert_eq!(err(SEP, &mori_default_port, &both), value_error(&staging_error("mori")));

        let env = rust_env("1");
        let mut a = args(
            SEP,
            &[
                ("disaggregation_mode", "prefill"),
                ("dcp_size", "2"),
                ("disaggregation_transfer_backend", "mooncake_tcp"),
            ],
        );
        let msgs = normalize(&mut a, &env).unwrap();
        assert_eq!(
            texts(&msgs),
            [
                "MC_FORCE_TCP=1 set in the process environment (it was unset)",
                MOONCAKE_TCP_INFO,
                DCP_PREFILL_WARNING,
                &rust_server_port_info(8998, 30000),
            ]
        );
        let levels: Vec<Level> = msgs.iter().map(|m| m.level).collect();
        assert_eq!(levels, [Level::Info, Level::Info, Level::Warning, Level::Info]);
    }

    #[test]
    fn rust_server_conflict_leaves_args_and_env_untouched() {
        let env = rust_env("1");
        let pairs = [
            ("disaggregation_mode", "prefill"),
            ("disaggregation_transfer_backend", "mooncake_tcp"),
            ("disaggregation_bootstrap_port", "9000"),
        ];
        assert_eq!(err(SEP, &pairs, &env).0, ErrorKind::ValueError);
        assert_eq!(env.var("MC_FORCE_TCP"), None);
    }

    #[test]
    fn rust_server_normalize_twice_is_stable() {
        let env = rust_env("1");
        let mut a = args(SEP, &[("disaggregation_mode", "prefill")]);
        normalize(&mut a, &env).unwrap();
        let once = a.clone();
        assert!(normalize(&mut a, &env).unwrap().is_empty(), "the port already equals the api port");
        assert_eq!(a, once);
    }

    /// 2026-09 is 2026-07 when neither DCP nor the Rust server is in play.
    #[test]
    fn sep_matches_jul_without_the_new_rules() {
        let cases: &[&[(&str, &str)]] = &[
            &[("disaggregation_mode", "decode"), ("max_running_requests", "64"), ("dp_size", "2")],
            &[
                ("disaggregation_mode", "decode"),
                ("disaggregation_decode_enable_radix_cache", "1"),
                ("enable_dp_attention", "1"),
            ],
            &[("disaggregation_mode", "decode"), ("mamba_scheduler_strategy", "extra_buffer")],
            &[("disaggregation_mode", "prefill"), ("disaggregation_bootstrap_port", "9000")],
            &[
                ("disaggregation_mode", "decode"),
                ("disaggregation_transfer_backend", "mori"),
                ("enable_hierarchical_cache", "1"),
            ],
        ];
        for pairs in cases {
            let mut jul = args(RuleSet::Upstream202607, pairs);
            let mut sep = args(SEP, pairs);
            let jul_msgs = normalize(&mut jul, &MapEnv::new()).unwrap();
            let sep_msgs = normalize(&mut sep, &MapEnv::new()).unwrap();
            assert_eq!(jul_msgs, sep_msgs, "{pairs:?}");
            sep.pdx_rules = RuleSet::Upstream202607;
            assert_eq!(jul, sep, "{pairs:?}");
        }
    }

    /// The older rule sets never read `dcp_size`, HiCache or
    /// `SGLANG_RUST_SERVER`.
    #[test]
    fn older_rule_sets_ignore_the_2026_09_rules() {
        for rules in BOTH {
            let pairs = [
                ("disaggregation_mode", "decode"),
                ("dcp_size", "4"),
                ("disaggregation_transfer_backend", "mori"),
                ("enable_hierarchical_cache", "true"),
            ];
            let mut a = args(rules, &pairs);
            assert_eq!(texts(&normalize(&mut a, &MapEnv::new()).unwrap()), [CHUNK_CACHE_WARNING]);

            let mut a = args(rules, &[("disaggregation_mode", "prefill"), ("dcp_size", "4")]);
            assert!(normalize(&mut a, &MapEnv::new()).unwrap().is_empty(), "{rules:?}: no DCP warning");

            for env in [rust_env("1"), rust_env("garbage")] {
                let mut a =
                    args(rules, &[("disaggregation_mode", "prefill"), ("disaggregation_bootstrap_port", "9000")]);
                assert!(normalize(&mut a, &env).unwrap().is_empty(), "{rules:?}");
                assert_eq!(a.disaggregation_bootstrap_port, 9000);
            }
        }
    }
}
