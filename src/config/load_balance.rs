//! SGLang's `ServerArgs._handle_load_balance_method`.

use super::args::ServerArgs;
use super::choices::DISAGGREGATION_MODE_CHOICES;
use super::py;
use crate::error::{Error, Result};

/// Reject an unknown mode (`ValueError` `Invalid disaggregation_mode='x'`),
/// then resolve `load_balance_method == "auto"`: `follow_bootstrap_room` for
/// prefill, `round_robin` otherwise. Explicit methods are kept.
pub fn handle_load_balance_method(args: &mut ServerArgs) -> Result<()> {
    if !DISAGGREGATION_MODE_CHOICES.contains(&args.disaggregation_mode.as_str()) {
        return Err(Error::value_error(format!(
            "Invalid disaggregation_mode={}",
            py::repr_str(&args.disaggregation_mode)
        )));
    }
    if args.load_balance_method == "auto" {
        args.load_balance_method =
            if args.disaggregation_mode == "prefill" { "follow_bootstrap_room" } else { "round_robin" }.to_owned();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn lb(mode: &str, method: &str) -> Result<String> {
        let mut a =
            ServerArgs { disaggregation_mode: mode.into(), load_balance_method: method.into(), ..Default::default() };
        handle_load_balance_method(&mut a).map(|_| a.load_balance_method)
    }

    // Ported from SGLang's TestLoadBalanceMethod.
    #[test]
    fn non_pd_defaults_to_round_robin() {
        assert_eq!(lb("null", "auto").unwrap(), "round_robin");
    }

    #[test]
    fn pd_prefill_defaults_to_follow_bootstrap_room() {
        assert_eq!(lb("prefill", "auto").unwrap(), "follow_bootstrap_room");
    }

    #[test]
    fn pd_decode_defaults_to_round_robin() {
        assert_eq!(lb("decode", "auto").unwrap(), "round_robin");
    }

    #[test]
    fn explicit_method_is_kept() {
        assert_eq!(lb("prefill", "total_tokens").unwrap(), "total_tokens");
    }

    #[test]
    fn invalid_mode_is_a_value_error_with_repr() {
        let e = lb("encode", "auto").unwrap_err();
        assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, "Invalid disaggregation_mode='encode'"));
        assert_eq!(lb("it's", "auto").unwrap_err().message(), "Invalid disaggregation_mode=\"it's\"");
    }
}
