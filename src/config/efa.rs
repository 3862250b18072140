//! sglang 0.5.23's EFA allocator guard
//! (`sglang/srt/disaggregation/mooncake/utils.py`,
//! `_validate_efa_allocator_compatibility`, run when its Mooncake KV manager
//! starts): under `MOONCAKE_PROTOCOL=efa` (any case) the current libfabric
//! EFA provider cannot transfer CUDA VMM allocations, so a Mooncake custom
//! memory pool of type NVLINK or BAREX, and PyTorch's
//! `expandable_segments:True`, are refused with SGLang's texts.

use super::env::{names, Env};
use crate::error::{Error, Result};

/// `SUPPORTED_MOONCAKE_CUSTOM_MEM_POOL_TYPES`.
pub const CUSTOM_MEM_POOL_TYPES: &[&str] = &["NVLINK", "BAREX", "INTRA_NODE_NVLINK"];

/// The allocator variables SGLang reads, in its order.
pub const ALLOC_CONF_VARS: &[&str] = &[names::PYTORCH_CUDA_ALLOC_CONF, names::PYTORCH_ALLOC_CONF];

/// `check_mooncake_custom_mem_pool_enabled()`: `(enabled, type)`. Unset is
/// `(false, None)`; `true` in any case means NVLINK; a type outside
/// [`CUSTOM_MEM_POOL_TYPES`] is kept but not enabled.
pub fn custom_mem_pool(env: &dyn Env) -> (bool, Option<String>) {
    match env.var(names::SGLANG_MOONCAKE_CUSTOM_MEM_POOL) {
        None => (false, None),
        Some(raw) => {
            let kind = if raw.to_lowercase() == "true" { "NVLINK".to_owned() } else { raw };
            (CUSTOM_MEM_POOL_TYPES.contains(&kind.as_str()), Some(kind))
        }
    }
}

/// `_cuda_expandable_segments_enabled()`: the first allocator variable with
/// a comma-separated field `expandable_segments:<v>` whose key and value,
/// trimmed, are `expandable_segments` and `true` (any case).
pub fn expandable_segments_var(env: &dyn Env) -> Option<&'static str> {
    ALLOC_CONF_VARS.iter().copied().find(|var| {
        env.var(var).unwrap_or_default().split(',').any(|field| {
            let (key, value) = field.split_once(':').unwrap_or((field, ""));
            py_strip(key) == "expandable_segments" && py_strip(value).to_lowercase() == "true"
        })
    })
}

fn py_strip(s: &str) -> &str {
    super::py::strip(s)
}

/// ValueError: a custom memory pool under EFA.
pub fn custom_mem_pool_error(kind: &str) -> String {
    format!("SGLANG_MOONCAKE_CUSTOM_MEM_POOL={kind} is incompatible with MOONCAKE_PROTOCOL=efa. Mooncake custom memory pools use CUDA VMM allocations, which the current libfabric EFA provider cannot transfer. Unset SGLANG_MOONCAKE_CUSTOM_MEM_POOL.")
}

/// ValueError: expandable segments under EFA.
pub fn expandable_segments_error(var: &str) -> String {
    format!("{var} enables expandable_segments, which is incompatible with MOONCAKE_PROTOCOL=efa because the current libfabric EFA provider cannot transfer CUDA VMM allocations. Disable expandable_segments.")
}

/// Whether `protocol` is EFA as the guard compares it (Python's `lower()`).
pub fn is_efa(protocol: &str) -> bool {
    protocol.to_lowercase() == "efa"
}

/// The guard for an engine whose protocol is `protocol`: nothing unless it
/// is EFA; then the custom pool (NVLINK or BAREX), then expandable segments.
pub fn check_allocator_for(env: &dyn Env, protocol: &str) -> Result<()> {
    if !is_efa(protocol) {
        return Ok(());
    }
    if let (true, Some(kind)) = custom_mem_pool(env) {
        if kind == "NVLINK" || kind == "BAREX" {
            return Err(Error::value_error(custom_mem_pool_error(&kind)));
        }
    }
    match expandable_segments_var(env) {
        Some(var) => Err(Error::value_error(expandable_segments_error(var))),
        None => Ok(()),
    }
}

/// `_validate_efa_allocator_compatibility(*check_mooncake_custom_mem_pool_enabled())`
/// as SGLang runs it: the protocol is `MOONCAKE_PROTOCOL` (default `rdma`).
pub fn validate_efa_allocator_compatibility(env: &dyn Env) -> Result<()> {
    let protocol = env.var(names::MOONCAKE_PROTOCOL).unwrap_or_else(|| "rdma".to_owned());
    check_allocator_for(env, &protocol)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::MapEnv;
    use crate::error::ErrorKind;

    fn check(pairs: &[(&str, &str)]) -> Result<()> {
        validate_efa_allocator_compatibility(&MapEnv::from_pairs(pairs))
    }

    #[test]
    fn texts_are_sglangs() {
        assert_eq!(
            custom_mem_pool_error("NVLINK"),
            "SGLANG_MOONCAKE_CUSTOM_MEM_POOL=NVLINK is incompatible with MOONCAKE_PROTOCOL=efa. Mooncake custom memory pools use CUDA VMM allocations, which the current libfabric EFA provider cannot transfer. Unset SGLANG_MOONCAKE_CUSTOM_MEM_POOL."
        );
        assert_eq!(
            expandable_segments_error("PYTORCH_ALLOC_CONF"),
            "PYTORCH_ALLOC_CONF enables expandable_segments, which is incompatible with MOONCAKE_PROTOCOL=efa because the current libfabric EFA provider cannot transfer CUDA VMM allocations. Disable expandable_segments."
        );
    }

    #[test]
    fn only_under_efa_in_any_case() {
        let bad =
            [("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "NVLINK"), ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")];
        check(&bad).unwrap();
        for p in ["rdma", "tcp", "", "efa "] {
            let mut pairs = bad.to_vec();
            pairs.push(("MOONCAKE_PROTOCOL", p));
            check(&pairs).unwrap();
        }
        for p in ["efa", "EFA", "Efa"] {
            let e = check(&[("MOONCAKE_PROTOCOL", p), ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "true")]).unwrap_err();
            assert_eq!((e.kind(), e.message()), (ErrorKind::ValueError, custom_mem_pool_error("NVLINK").as_str()));
        }
    }

    #[test]
    fn pool_types() {
        let efa = ("MOONCAKE_PROTOCOL", "efa");
        for ok in ["INTRA_NODE_NVLINK", "nvlink", "other", ""] {
            check(&[efa, ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", ok)]).unwrap();
        }
        let e = check(&[efa, ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "BAREX")]).unwrap_err();
        assert_eq!(e.message(), custom_mem_pool_error("BAREX"));
        // The pool is checked before the allocator.
        let e = check(&[
            efa,
            ("SGLANG_MOONCAKE_CUSTOM_MEM_POOL", "TRUE"),
            ("PYTORCH_ALLOC_CONF", "expandable_segments:true"),
        ])
        .unwrap_err();
        assert_eq!(e.message(), custom_mem_pool_error("NVLINK"));
    }

    #[test]
    fn expandable_segments_fields() {
        let efa = ("MOONCAKE_PROTOCOL", "efa");
        for on in [
            "expandable_segments:True",
            " expandable_segments : TRUE ",
            "max_split_size_mb:128,expandable_segments:true",
        ] {
            for var in ALLOC_CONF_VARS {
                let e = check(&[efa, (var, on)]).unwrap_err();
                assert_eq!(e.message(), expandable_segments_error(var), "{var}={on:?}");
            }
        }
        for off in [
            "expandable_segments:False",
            "expandable_segments",
            "expandable_segments:1",
            "expandable_segments:true:x",
            "",
        ] {
            check(&[efa, ("PYTORCH_CUDA_ALLOC_CONF", off)]).unwrap();
        }
        // PYTORCH_CUDA_ALLOC_CONF is named first when both enable it.
        let both = [
            efa,
            ("PYTORCH_ALLOC_CONF", "expandable_segments:True"),
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ];
        assert_eq!(check(&both).unwrap_err().message(), expandable_segments_error("PYTORCH_CUDA_ALLOC_CONF"));
    }
}
