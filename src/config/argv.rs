//! Reading the PD-related flags out of an SGLang command line.
//!
//! Recognized: `--flag value`, `--flag=value`, bare boolean flags (argparse
//! `store_true`; `--flag=false` is accepted too), repeated flags (last one
//! wins). Everything else is left alone: unknown flags, their values,
//! positionals, single-dash options, and everything after a bare `--`.
//! argparse's prefix abbreviations are not recognized (an abbreviated flag
//! counts as unknown).

use super::args::{lookup, Kind, ServerArgs};
use crate::error::{Error, Result};

/// Whether argparse would take `token` as an option rather than a value:
/// it starts with `-` and is not a negative number.
fn looks_like_option(token: &str) -> bool {
    token.starts_with('-') && token.len() > 1 && token[1..].parse::<f64>().is_err()
}

/// Apply the recognized flags of `argv` to `args`. On error `args` is
/// unchanged. `argv` may include the program name; it is skipped like any
/// other non-flag token.
///
/// Errors: a recognized flag without its value gives `InvalidValue`
/// `argument --flag: expected one argument` (argparse's text); a value that
/// does not parse gives the `InvalidValue` of [`ServerArgs::set`].
pub fn parse_argv<S: AsRef<str>>(args: &mut ServerArgs, argv: &[S]) -> Result<()> {
    let mut work = args.clone();
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
        let (flag, inline) = match token.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (token, None),
        };
        let Some(spec) = lookup(flag) else { continue };
        let value = match (spec.kind, inline) {
            (_, Some(v)) => v,
            (Kind::Bool, None) => "true",
            (_, None) => match argv.get(i).map(AsRef::as_ref) {
                Some(next) if !looks_like_option(next) => {
                    i += 1;
                    next
                }
                _ => {
                    return Err(Error::invalid_value(format!(
                        "argument {}: expected one argument",
                        spec.flags.join("/")
                    )))
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
            (ErrorKind::InvalidValue, "argument --dp-size/--data-parallel-size: expected one argument")
        );
        assert_eq!(a, ServerArgs::default());
        let e = parse_argv(&mut a, &["--disaggregation-transfer-backend", "--port", "1"]).unwrap_err();
        assert_eq!(e.message(), "argument --disaggregation-transfer-backend: expected one argument");
        let e = parse_argv(&mut a, &["--disaggregation-transfer-backend", "rdma"]).unwrap_err();
        assert!(e.message().contains("allowed values: mooncake, nixl"));
    }

    #[test]
    fn field_names_are_not_flags() {
        let a = parse(&["disaggregation_mode", "decode", "--disaggregation_mode", "decode"]).unwrap();
        assert_eq!(a.disaggregation_mode, "null");
    }
}
