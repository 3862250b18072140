//! Reading the PD-related flags out of an SGLang command line, the way
//! SGLang's argparse parser reads them.
//!
//! Recognized: `--flag value`, `--flag=value`, bare boolean flags (argparse
//! `store_true`; `--flag=false` is accepted too), repeated flags (last one
//! wins), and argparse's abbreviations (`allow_abbrev`): a token that is not
//! an exact option string is resolved as a prefix against SGLang's whole
//! option list of the rule set in effect ([`super::sglang_flags`]), exactly
//! as Python 3.11's `ArgumentParser._parse_optional` does. One match is that
//! option (`--disaggregation-transfer mooncake_tcp` sets the backend); more
//! than one is argparse's error `ambiguous option: TOKEN could match A, B`.
//! A shortened pdx flag that list has no option for (pdx's own `--pdx-rules`,
//! or a flag that commit lacks) is an error asking for the full name, never
//! ignored. Everything else is left alone: options that are not PD flags
//! (exact or abbreviated) and their values, positionals, single-dash
//! options, and everything after a bare `--`.
//!
//! Each rule set has its own list, because a prefix unique at one commit can
//! be ambiguous at another (`--dcp` is `--dcp-size` under `2026-07`, and
//! matches three options under `2026-09`).
//!
//! The rule set whose list applies is the last `--pdx-rules` of `argv`
//! (exact spelling), else the one `args` already has.

use super::args::{lookup, Kind, RuleSet, ServerArgs, FIELDS};
use super::sglang_flags::{FLAGS_6076066E3, FLAGS_77E0052, FLAGS_D4801BE, FLAGS_SGLANG_0_5_23};
use crate::error::{Error, Result};

/// Whether argparse would take `token` as an option rather than a value:
/// it starts with `-` and is not a negative number.
fn looks_like_option(token: &str) -> bool {
    token.starts_with('-') && token.len() > 1 && token[1..].parse::<f64>().is_err()
}

/// SGLang's option list under one rule set: one entry per argparse action,
/// its option strings in declaration order.
type Table = &'static [&'static [&'static str]];

/// SGLang's option list under `rules`, at the commit the rule set follows.
pub fn sglang_options(rules: RuleSet) -> Table {
    match rules {
        RuleSet::Pr26346 => FLAGS_6076066E3,
        RuleSet::Upstream202607 => FLAGS_D4801BE,
        RuleSet::Upstream202609 => FLAGS_77E0052,
        RuleSet::Upstream202610 => FLAGS_SGLANG_0_5_23,
    }
}

/// The action of `option` in `table`: its option strings.
fn action_of(table: Table, option: &str) -> Option<&'static [&'static str]> {
    table.iter().copied().find(|a| a.contains(&option))
}

/// How a `--` token resolves (argparse's `_parse_optional`).
#[derive(Debug, PartialEq, Eq)]
enum Resolved<'a> {
    /// An option string (SGLang's or pdx's own) and the text after `=`.
    Option(&'a str, Option<&'a str>),
    /// Not an option argparse knows.
    Unknown,
}

fn is_exact(table: Table, option: &str) -> bool {
    table.iter().any(|a| a.contains(&option)) || lookup(option).is_some_and(|spec| spec.flags.contains(&option))
}

/// Resolve `token` (starting with `--`) against `table`, Python 3.11
/// argparse order: the exact string; the part before `=` exactly; else every
/// option string starting with the part before `=` (more than one:
/// `ambiguous option`, counted per option string as 3.11 does).
fn resolve<'a>(table: Table, token: &'a str) -> Result<Resolved<'a>> {
    if is_exact(table, token) {
        return Ok(Resolved::Option(token, None));
    }
    let (prefix, explicit) = match token.split_once('=') {
        Some((f, v)) if is_exact(table, f) => return Ok(Resolved::Option(f, Some(v))),
        Some((f, v)) => (f, Some(v)),
        None => (token, None),
    };
    let matches: Vec<&'static str> =
        table.iter().flat_map(|a| a.iter().copied()).filter(|o| o.starts_with(prefix)).collect();
    match matches.as_slice() {
        [] => {
            // argparse would not know it either ("unrecognized arguments");
            // a shortened pdx flag outside that list is refused, not ignored.
            let ours: Vec<&str> =
                FIELDS.iter().flat_map(|f| f.flags.iter().copied()).filter(|f| f.starts_with(prefix)).collect();
            if ours.is_empty() {
                return Ok(Resolved::Unknown);
            }
            Err(Error::invalid_value(format!(
                "unrecognized option {token}: SGLang's parser of this rule set has no option it abbreviates; write {} in full",
                ours.join(" or ")
            )))
        }
        [one] => Ok(Resolved::Option(one, explicit)),
        many => Err(Error::invalid_value(format!("ambiguous option: {token} could match {}", many.join(", ")))),
    }
}

/// The rule set of the last exact `--pdx-rules` before any bare `--`.
fn rules_in(argv: &[impl AsRef<str>], current: RuleSet) -> RuleSet {
    let mut rules = current;
    let mut words = argv.iter().map(AsRef::as_ref);
    while let Some(token) = words.next() {
        let value = match token {
            "--" => break,
            "--pdx-rules" => words.next(),
            t => t.strip_prefix("--pdx-rules="),
        };
        if let Some(r) = value.and_then(RuleSet::from_name) {
            rules = r;
        }
    }
    rules
}

/// Apply the recognized flags of `argv` to `args`. On error `args` is
/// unchanged. `argv` may include the program name; it is skipped like any
/// other non-flag token.
///
/// Errors (`InvalidValue`, argparse's texts): a recognized flag without its
/// value gives `argument A/B: expected one argument`, naming the action's
/// option strings as SGLang declares them under the rule set in effect; an
/// abbreviation of several options gives `ambiguous option: ...`; a value
/// that does not parse gives the error of [`ServerArgs::set`].
pub fn parse_argv<S: AsRef<str>>(args: &mut ServerArgs, argv: &[S]) -> Result<()> {
    let mut work = args.clone();
    let table = sglang_options(rules_in(argv, args.pdx_rules));
    let mut i = 0;
    while i < argv.len() {
        let token = argv[i].as_ref();
        i += 1;
        if token == "--" {
            break;
        }
        if !token.starts_with("--") {
            continue;
        }
        let Resolved::Option(option, inline) = resolve(table, token)? else { continue };
        let Some(spec) = lookup(option) else { continue };
        let value = match (spec.kind, inline) {
            (_, Some(v)) => v,
            (Kind::Bool, None) => "true",
            (_, None) => match argv.get(i).map(AsRef::as_ref) {
                Some(next) if !looks_like_option(next) => {
                    i += 1;
                    next
                }
                _ => {
                    let names = action_of(table, option).unwrap_or(spec.flags);
                    return Err(Error::invalid_value(format!("argument {}: expected one argument", names.join("/"))));
                }
            },
        };
        work.set(spec.name, Some(value))?;
    }
    *args = work;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn parse(argv: &[&str]) -> Result<ServerArgs> {
        let mut a = ServerArgs::default();
        parse_argv(&mut a, argv).map(|_| a)
    }

    #[test]
    fn reads_pd_flags_and_skips_the_rest() {
        let a = parse(&[
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "/models/x",
            "--disaggregation-mode",
            "decode",
            "--disaggregation-transfer-backend=mooncake_tcp",
            "--disaggregation-ib-device",
            "mlx5_0",
            "--tp",
            "8",
            "--disaggregation-decode-enable-radix-cache",
            "--dp-size",
            "2",
            "--trust-remote-code",
            "--max-running-requests=64",
        ])
        .unwrap();
        assert_eq!(a.disaggregation_mode, "decode");
        assert_eq!(a.disaggregation_transfer_backend, "mooncake_tcp");
        assert_eq!(a.disaggregation_ib_device.as_deref(), Some("mlx5_0"));
        assert!(a.disaggregation_decode_enable_radix_cache);
        assert_eq!((a.dp_size, a.max_running_requests), (2, Some(64)));
    }

    #[test]
    fn bare_bool_does_not_consume_the_next_token() {
        let a = parse(&["--enable-hisparse", "--disaggregation-mode", "prefill"]).unwrap();
        assert!(a.enable_hisparse);
        assert_eq!(a.disaggregation_mode, "prefill");
        let a = parse(&["--enable-hisparse=no"]).unwrap();
        assert!(!a.enable_hisparse);
    }

    #[test]
    fn aliases_last_wins_negative_numbers_and_double_dash() {
        let a =
            parse(&["--data-parallel-size", "4", "--dp-size", "8", "--port", "-1", "--", "--dp-size", "16"]).unwrap();
        assert_eq!((a.dp_size, a.port), (8, -1));
        let a = parse(&["--disaggregation-ib-device=", "--speculative-algorithm", "EAGLE"]).unwrap();
        assert_eq!(a.disaggregation_ib_device.as_deref(), Some(""));
        assert_eq!(a.speculative_algorithm.as_deref(), Some("EAGLE"));
    }

    #[test]
    fn missing_value_is_an_argparse_style_error_and_changes_nothing() {
        let mut a = ServerArgs::default();
        let e = parse_argv(&mut a, &["--disaggregation-mode", "prefill", "--dp-size"]).unwrap_err();
        assert_eq!(
            (e.kind(), e.message()),
            (ErrorKind::InvalidValue, "argument --data-parallel-size/--dp-size: expected one argument")
        );
        assert_eq!(a, ServerArgs::default());
        let e = parse_argv(&mut a, &["--disaggregation-transfer-backend", "--port", "1"]).unwrap_err();
        assert_eq!(e.message(), "argument --disaggregation-transfer-backend: expected one argument");
        let e = parse_argv(&mut a, &["--disaggregation-transfer-backend", "rdma"]).unwrap_err();
        assert!(e.message().contains("allowed values: mooncake, nixl"));
    }

    /// `--dp-size` without a value names the action as SGLang declares it:
    /// server_args.py at 6076066e3 line 5192-5193 `"--data-parallel-size",
    /// "--dp-size"`; at d4801be line 910-914 `dp_size: A[int,
    /// Arg(aliases=["--data-parallel-size"])]` (cli name first).
    #[test]
    fn missing_value_names_the_option_as_declared_at_that_commit() {
        let e = parse(&["--dp-size"]).unwrap_err();
        assert_eq!(e.message(), "argument --data-parallel-size/--dp-size: expected one argument");
        let e = parse(&["--pdx-rules", "2026-07", "--dp-size"]).unwrap_err();
        assert_eq!(e.message(), "argument --dp-size/--data-parallel-size: expected one argument");
        let mut a = ServerArgs::default();
        a.set("pdx_rules", Some("2026-07")).unwrap();
        let e = parse_argv(&mut a, &["--data-parallel-size"]).unwrap_err();
        assert_eq!(e.message(), "argument --dp-size/--data-parallel-size: expected one argument");
        let e = parse(&["--dcp-size"]).unwrap_err();
        assert_eq!(e.message(), "argument --dcp-size/--decode-context-parallel-size: expected one argument");
    }

    /// argparse's `allow_abbrev` (SGLang's parser: server_args.py at
    /// 6076066e3 line 7576 / d4801be line 7978,
    /// `argparse.ArgumentParser(prog="sglang serve")`, then
    /// `parser.parse_args(argv)`): a unique prefix is that option.
    #[test]
    fn unique_prefixes_resolve_like_argparse() {
        let a = parse(&["--disaggregation-transfer", "mooncake_tcp"]).unwrap();
        assert_eq!(a.disaggregation_transfer_backend, "mooncake_tcp");
        let a = parse(&["--disaggregation-transfer=mooncake_tcp", "--disaggregation-m", "decode"]).unwrap();
        assert_eq!(
            (a.disaggregation_transfer_backend.as_str(), a.disaggregation_mode.as_str()),
            ("mooncake_tcp", "decode")
        );
        let a = parse(&["--data-par", "4", "--enable-hisp"]).unwrap();
        assert_eq!(a.dp_size, 4);
        assert!(a.enable_hisparse);
        // A prefix of a non-PD option is that option: left alone.
        let a = parse(&["--model", "/m", "--trust-remote", "--disaggregation-mode", "prefill"]).unwrap();
        assert_eq!(a.disaggregation_mode, "prefill");
        // The missing-value text names the resolved action.
        let e = parse(&["--data-parallel"]).unwrap_err();
        assert_eq!(e.message(), "argument --data-parallel-size/--dp-size: expected one argument");
        // `--disaggregation-decode-extra-slots` is not in 6076066e3's list,
        // so its prefix is one only under 2026-07 (exact use works in both).
        let a = parse(&["--pdx-rules=2026-07", "--disaggregation-decode-extra", "3"]).unwrap();
        assert_eq!(a.disaggregation_decode_extra_slots, Some(3));
        let a = parse(&["--disaggregation-decode-extra-slots", "3"]).unwrap();
        assert_eq!(a.disaggregation_decode_extra_slots, Some(3));
    }

    /// A prefix of several options is argparse's error (Python 3.11
    /// `_parse_optional`: `ambiguous option: %(option)s could match
    /// %(matches)s`), listing them in SGLang's declaration order; never
    /// ignored, and nothing changes.
    #[test]
    fn ambiguous_prefixes_are_argparse_errors() {
        let mut a = ServerArgs::default();
        let e = parse_argv(&mut a, &["--disaggregation-mode", "decode", "--disaggregation-decode", "1"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidValue);
        assert_eq!(a, ServerArgs::default());
        let want: Vec<&str> = sglang_options(RuleSet::Pr26346)
            .iter()
            .flat_map(|o| o.iter().copied())
            .filter(|o| o.starts_with("--disaggregation-decode"))
            .collect();
        assert!(want.len() > 1, "{want:?}");
        assert_eq!(e.message(), format!("ambiguous option: --disaggregation-decode could match {}", want.join(", ")));
        let e = parse(&["--disagg=prefill"]).unwrap_err();
        assert!(
            e.message().starts_with("ambiguous option: --disagg=prefill could match --disaggregation-mode, "),
            "{}",
            e.message()
        );
        // A shortened flag SGLang's list lacks is refused, never ignored:
        // pdx's own flag, and one that list of the rule set does not have.
        let e = parse(&["--pdx-rul", "2026-07"]).unwrap_err();
        assert_eq!(
            e.message(),
            "unrecognized option --pdx-rul: SGLang's parser of this rule set has no option it abbreviates; write --pdx-rules in full"
        );
        let e = parse(&["--optimistic-prefill", "2"]).unwrap_err();
        assert!(e.message().ends_with("write --optimistic-prefill-attempts in full"), "{}", e.message());
        let a = parse(&["--pdx-rules", "2026-07", "--optimistic-prefill", "2"]).unwrap();
        assert_eq!(a.optimistic_prefill_attempts, 2);
    }

    #[test]
    fn tables_hold_every_sglang_pd_flag_of_their_commit() {
        for rules in [RuleSet::Pr26346, RuleSet::Upstream202607, RuleSet::Upstream202609] {
            let table = sglang_options(rules);
            assert_eq!(table[0], &["-h", "--help"]);
            let all: Vec<&str> = table.iter().flat_map(|a| a.iter().copied()).collect();
            let unique: std::collections::HashSet<&str> = all.iter().copied().collect();
            assert_eq!(all.len(), unique.len(), "an option string registered twice");
            for flag in [
                "--disaggregation-mode",
                "--disaggregation-transfer-backend",
                "--disaggregation-ib-device",
                "--mooncake-ib-device",
                "--dp-size",
                "--port",
            ] {
                assert!(unique.contains(flag), "{flag} under {rules:?}");
            }
        }
    }

    #[test]
    fn field_names_are_not_flags() {
        let a = parse(&["disaggregation_mode", "decode", "--disaggregation_mode", "decode"]).unwrap();
        assert_eq!(a.disaggregation_mode, "null");
    }

    /// Under 2026-09 abbreviations resolve against SGLang's list at
    /// 77e0052 (zihanlin-ai/sglang, server_args.py: `add_cli_args_from_dataclass`
    /// over the `ServerArgs` fields, then 30 `add_argument` calls), not an
    /// older one: a unique prefix is that option, the rule set's own fields
    /// included.
    #[test]
    fn rules_2026_09_resolve_prefixes_against_their_own_list() {
        let a = parse(&[
            "--pdx-rules",
            "2026-09",
            "--model",
            "/m",
            "--decode-context",
            "4",
            "--enable-hier",
            "--disaggregation-boot=9000",
            "--disaggregation-transfer",
            "mooncake_tcp",
            "--tp",
            "8",
        ])
        .unwrap();
        assert_eq!(a.pdx_rules, RuleSet::Upstream202609);
        assert_eq!((a.dcp_size, a.disaggregation_bootstrap_port), (4, 9000));
        assert!(a.enable_hierarchical_cache);
        assert_eq!(a.disaggregation_transfer_backend, "mooncake_tcp");
        // `--dcp-s` is still unique; the rule set already on the arguments counts too.
        let mut a = ServerArgs { pdx_rules: RuleSet::Upstream202609, ..Default::default() };
        parse_argv(&mut a, &["--dcp-s", "2", "--disaggregation-m", "decode"]).unwrap();
        assert_eq!((a.dcp_size, a.disaggregation_mode.as_str()), (2, "decode"));
        // A missing value names the action as 77e0052 declares it
        // (`dcp_size: A[int, Arg(aliases=["--decode-context-parallel-size"])]`).
        let e = parse(&["--pdx-rules", "2026-09", "--decode-context"]).unwrap_err();
        assert_eq!(e.message(), "argument --dcp-size/--decode-context-parallel-size: expected one argument");
        assert_eq!(
            parse(&["--pdx-rules", "2026-09", "--data-par"]).unwrap_err().message(),
            "argument --dp-size/--data-parallel-size: expected one argument"
        );
    }

    /// Options new at 77e0052 make prefixes ambiguous that were unique in
    /// July: `--dcp` is `--dcp-size` under 2026-07, but under 2026-09 it also
    /// matches `--dcp-comm-backend` and `--dcp-replicate-q-proj`, and
    /// argparse lists them in declaration order. Nothing changes on error.
    #[test]
    fn rules_2026_09_ambiguous_prefixes_list_that_commits_options() {
        let a = parse(&["--pdx-rules", "2026-07", "--dcp", "2"]).unwrap();
        assert_eq!(a.dcp_size, 2);
        let mut a = ServerArgs::default();
        let e = parse_argv(&mut a, &["--disaggregation-mode", "decode", "--pdx-rules", "2026-09", "--dcp", "2"])
            .unwrap_err();
        assert_eq!(
            (e.kind(), e.message()),
            (
                ErrorKind::InvalidValue,
                "ambiguous option: --dcp could match --dcp-size, --dcp-comm-backend, --dcp-replicate-q-proj"
            )
        );
        assert_eq!(a, ServerArgs::default());
        // `--disaggregation-decode-retraction-backup` is new at 77e0052.
        let e = parse(&["--pdx-rules=2026-09", "--disaggregation-decode=1"]).unwrap_err();
        assert_eq!(
            e.message(),
            "ambiguous option: --disaggregation-decode=1 could match --disaggregation-decode-enable-radix-cache, \
             --disaggregation-decode-enable-offload-kvcache, --disaggregation-decode-retraction-backup, \
             --disaggregation-decode-extra-slots, --disaggregation-decode-polling-interval"
        );
        // argparse's `BooleanOptionalAction` registers `--no-X` after `--X`:
        // `--no` is `--node-rank` or one of those.
        let e = parse(&["--pdx-rules", "2026-09", "--no"]).unwrap_err();
        assert_eq!(
            e.message(),
            "ambiguous option: --no could match --node-rank, --no-dcp-replicate-q-proj, \
             --no-enable-tp-lm-head-all-to-all, --no-experts-shared-outer-loras, --no-lora-strict-loading, \
             --no-dllm-fdfo"
        );
        // A shortened pdx flag outside SGLang's list is still refused.
        let e = parse(&["--pdx-rules", "2026-09", "--pdx-rul", "2026-07"]).unwrap_err();
        assert!(e.message().ends_with("write --pdx-rules in full"), "{}", e.message());
    }
}
