//! Transport resolution: which Mooncake protocol, hostname and device an
//! engine should initialize with, and why.
//!
//! Mirrors `MooncakeTransferEngine.__init__` / `initialize` in SGLang (after
//! PR #25083) plus Mooncake's own reading of `MC_FORCE_TCP`:
//!
//! 1. The requested protocol: the explicit argument, else `"ascend"` when
//!    `ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE` is true, else `MOONCAKE_PROTOCOL`
//!    (default `"rdma"`, used verbatim). It must be one of
//!    [`KNOWN_PROTOCOLS`], else `UnknownProtocol`.
//! 2. `MC_FORCE_TCP` present (any value) → protocol `"tcp"`, device `""`,
//!    hostname unchanged: Mooncake installs its TCP transport whenever the
//!    variable exists. A false-looking value (`0`, `false`, `no`, `n`, `""`)
//!    adds a warning, because it does not turn the forcing off.
//! 3. Otherwise the device is `get_ib_devices_for_gpu(device, gpu_id)`
//!    (`""` when none: Mooncake auto-discovers), and for `"ascend"` the
//!    hostname becomes `host:{free_port}:npu_{ASCEND_NPU_PHY_ID or gpu_id}`.

use super::env::{self, names, Env, ProcessEnv};
use super::ib_device::get_ib_devices_for_gpu;
use super::net;
use crate::error::{Error, ErrorKind, Result};

/// Protocol names Mooncake's `TransferEngine` installs transports for.
pub const KNOWN_PROTOCOLS: &[&str] =
    &["rdma", "efa", "tcp", "ascend", "nvlink", "nvlink_intra", "nvmeof", "cxl", "barex", "hip"];

/// `MOONCAKE_PROTOCOL`'s default (since SGLang PR #25083).
pub const DEFAULT_PROTOCOL: &str = "rdma";

/// The outcome of [`resolve_transport`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportChoice {
    /// The protocol to pass to the engine (`"rdma"`, `"tcp"`, `"ascend"`, ...).
    pub protocol: String,
    /// The hostname to pass to the engine. For Ascend it carries the
    /// `:{port}:npu_{id}` suffix; the session id still uses the plain host.
    pub hostname: String,
    /// The device filter to pass (`""` = auto discovery / TCP forced).
    pub device: String,
    /// One sentence explaining the choice.
    pub reason: String,
    /// Warnings about the environment (e.g. a false-looking `MC_FORCE_TCP`,
    /// unparsable Ascend variables).
    pub warnings: Vec<String>,
}

fn is_false_looking(value: &str) -> bool {
    value.is_empty() || env::parse_bool(value) == Ok(false)
}

/// Decide protocol, hostname and device for an engine on `hostname`.
///
/// `protocol` / `device` are the caller's explicit choices (`None` = not
/// given); `device` may be a comma list, an inline JSON mapping or a `.json`
/// file (see [`crate::config::ib_device`]). A negative `gpu_id` means "not
/// given" and counts as GPU 0, like SGLang's `gpu_id=None`.
///
/// Errors: `UnknownProtocol` (message lists [`KNOWN_PROTOCOLS`]); the IB
/// configuration errors of `get_ib_devices_for_gpu`; `Io` when no free port
/// can be found for the Ascend hostname.
pub fn resolve_transport(
    env: &dyn Env,
    hostname: &str,
    protocol: Option<&str>,
    device: Option<&str>,
    gpu_id: i32,
) -> Result<TransportChoice> {
    let gpu_id = i64::from(gpu_id.max(0));
    let mut warnings = Vec::new();

    let ascend = env::get_bool(env, names::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE, false);
    warnings.extend(ascend.warning);
    let (requested, source) = match protocol {
        Some(p) => {
            if ascend.value && p != "ascend" {
                warnings.push(format!(
                    "{} is true, but the explicit protocol '{p}' takes precedence over the Ascend path",
                    names::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE
                ));
            }
            (p.to_owned(), "the explicit protocol argument".to_owned())
        }
        None if ascend.value => {
            ("ascend".to_owned(), format!("{} is true", names::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE))
        }
        None => match env.var(names::MOONCAKE_PROTOCOL) {
            Some(p) => (p, names::MOONCAKE_PROTOCOL.to_owned()),
            None => (DEFAULT_PROTOCOL.to_owned(), "the default (MOONCAKE_PROTOCOL unset)".to_owned()),
        },
    };
    if !KNOWN_PROTOCOLS.contains(&requested.as_str()) {
        return Err(Error::new(
            ErrorKind::UnknownProtocol,
            format!(
                "unknown transport protocol '{requested}' (from {source}); known protocols: {}",
                KNOWN_PROTOCOLS.join(", ")
            ),
        ));
    }

    if let Some(force) = env.var(names::MC_FORCE_TCP) {
        if is_false_looking(&force) {
            warnings.push(format!(
                "MC_FORCE_TCP={force:?} looks false, but Mooncake forces the TCP transport whenever MC_FORCE_TCP is set; unset it to allow '{requested}'"
            ));
        }
        return Ok(TransportChoice {
            protocol: "tcp".to_owned(),
            hostname: hostname.to_owned(),
            device: String::new(),
            reason: format!("MC_FORCE_TCP is set (value {force:?}): Mooncake forces TCP; requested '{requested}' from {source} is overridden and no IB device is selected"),
            warnings,
        });
    }

    let device = get_ib_devices_for_gpu(device, gpu_id)?.unwrap_or_default();
    if requested == "ascend" {
        let phy = env::get_int(env, names::ASCEND_NPU_PHY_ID, Some(-1));
        warnings.extend(phy.warning);
        let phy = phy.value.unwrap_or(-1);
        let npu = if phy == -1 { gpu_id } else { phy };
        let port = net::free_port()?;
        return Ok(TransportChoice {
            protocol: "ascend".to_owned(),
            hostname: format!("{hostname}:{port}:npu_{npu}"),
            device,
            reason: format!(
                "protocol 'ascend' from {source}; hostname gets a free port and npu_{npu} ({})",
                if phy == -1 { "gpu_id, ASCEND_NPU_PHY_ID is -1" } else { "ASCEND_NPU_PHY_ID" }
            ),
            warnings,
        });
    }
    Ok(TransportChoice {
        protocol: requested.clone(),
        hostname: hostname.to_owned(),
        device,
        reason: format!("protocol '{requested}' from {source}"),
        warnings,
    })
}

/// [`resolve_transport`] against the real process environment.
pub fn resolve_transport_from_process_env(
    hostname: &str,
    protocol: Option<&str>,
    device: Option<&str>,
    gpu_id: i32,
) -> Result<TransportChoice> {
    resolve_transport(&ProcessEnv, hostname, protocol, device, gpu_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::MapEnv;

    fn resolve(
        pairs: &[(&str, &str)],
        protocol: Option<&str>,
        device: Option<&str>,
        gpu: i32,
    ) -> Result<TransportChoice> {
        resolve_transport(&MapEnv::from_pairs(pairs), "10.0.0.5", protocol, device, gpu)
    }

    #[test]
    fn default_is_rdma_with_given_device() {
        let c = resolve(&[], None, Some("mlx5_0,mlx5_1"), 0).unwrap();
        assert_eq!(
            (c.protocol.as_str(), c.hostname.as_str(), c.device.as_str()),
            ("rdma", "10.0.0.5", "mlx5_0,mlx5_1")
        );
        assert!(c.reason.contains("default"));
        assert!(c.warnings.is_empty());
        assert_eq!(resolve(&[], None, None, 0).unwrap().device, "");
    }

    #[test]
    fn mooncake_protocol_env_and_explicit_precedence() {
        let c = resolve(&[("MOONCAKE_PROTOCOL", "efa")], None, None, 0).unwrap();
        assert_eq!(c.protocol, "efa");
        assert!(c.reason.contains("MOONCAKE_PROTOCOL"));
        let c = resolve(&[("MOONCAKE_PROTOCOL", "efa")], Some("tcp"), None, 0).unwrap();
        assert_eq!(c.protocol, "tcp");
        assert!(c.reason.contains("explicit"));
    }

    #[test]
    fn unknown_protocol_lists_known() {
        let e = resolve(&[("MOONCAKE_PROTOCOL", "RDMA")], None, None, 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::UnknownProtocol);
        assert_eq!(
            e.message(),
            "unknown transport protocol 'RDMA' (from MOONCAKE_PROTOCOL); known protocols: rdma, efa, tcp, ascend, nvlink, nvlink_intra, nvmeof, cxl, barex, hip"
        );
        // An empty MOONCAKE_PROTOCOL is kept (EnvStr) and is unknown.
        assert_eq!(
            resolve(&[("MOONCAKE_PROTOCOL", "")], None, None, 0).unwrap_err().kind(),
            ErrorKind::UnknownProtocol
        );
        assert_eq!(
            resolve(&[("MC_FORCE_TCP", "1")], Some("carrier-pigeon"), None, 0).unwrap_err().kind(),
            ErrorKind::UnknownProtocol
        );
    }

    #[test]
    fn mc_force_tcp_presence_forces_tcp_and_empty_device() {
        let c = resolve(&[("MC_FORCE_TCP", "1"), ("MOONCAKE_PROTOCOL", "efa")], None, Some("mlx5_0"), 0).unwrap();
        assert_eq!((c.protocol.as_str(), c.device.as_str(), c.hostname.as_str()), ("tcp", "", "10.0.0.5"));
        assert!(c.reason.contains("MC_FORCE_TCP"));
        assert!(c.warnings.is_empty());
        // Even an invalid per-GPU device configuration is not consulted.
        assert_eq!(resolve(&[("MC_FORCE_TCP", "1")], None, Some("{bad"), 3).unwrap().device, "");
    }

    #[test]
    fn false_looking_mc_force_tcp_still_forces_with_warning() {
        for v in ["0", "false", "No", ""] {
            let c = resolve(&[("MC_FORCE_TCP", v)], Some("rdma"), None, 0).unwrap();
            assert_eq!(c.protocol, "tcp", "{v:?}");
            assert_eq!(c.warnings.len(), 1, "{v:?}");
            assert!(c.warnings[0].contains("Mooncake forces the TCP transport whenever MC_FORCE_TCP is set"));
        }
        assert!(resolve(&[("MC_FORCE_TCP", "yes")], None, None, 0).unwrap().warnings.is_empty());
    }

    #[test]
    fn per_gpu_device_mapping() {
        let map = r#"{"0": "mlx5_0", "1": "mlx5_1"}"#;
        assert_eq!(resolve(&[], None, Some(map), 1).unwrap().device, "mlx5_1");
        assert_eq!(resolve(&[], None, Some(map), -1).unwrap().device, "mlx5_0");
        let e = resolve(&[], None, Some(map), 2).unwrap_err();
        assert_eq!(e.message(), "No IB devices configured for GPU 2. Available GPUs: [0, 1]");
    }

    fn split_ascend(hostname: &str) -> (String, u16, String) {
        let mut parts = hostname.rsplitn(3, ':');
        let npu = parts.next().unwrap().to_owned();
        let port = parts.next().unwrap().parse().unwrap();
        (parts.next().unwrap().to_owned(), port, npu)
    }

    #[test]
    fn ascend_hostname_uses_gpu_id_or_phy_id() {
        let c = resolve(&[("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1")], None, None, 3).unwrap();
        assert_eq!(c.protocol, "ascend");
        let (host, port, npu) = split_ascend(&c.hostname);
        assert_eq!((host.as_str(), npu.as_str()), ("10.0.0.5", "npu_3"));
        assert_ne!(port, 0);

        let env = [
            ("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "true"),
            ("ASCEND_NPU_PHY_ID", "6"),
            ("MOONCAKE_PROTOCOL", "rdma"),
        ];
        let c = resolve(&env, None, None, 3).unwrap();
        assert_eq!(split_ascend(&c.hostname).2, "npu_6");
        assert!(c.reason.contains("ASCEND_NPU_PHY_ID"));

        let c = resolve(&[("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1"), ("ASCEND_NPU_PHY_ID", "x")], None, None, 2)
            .unwrap();
        assert_eq!(split_ascend(&c.hostname).2, "npu_2");
        assert_eq!(
            c.warnings,
            vec!["Invalid value for ASCEND_NPU_PHY_ID: \"x\" is not a valid integer value, using default \"-1\""
                .to_owned()]
        );

        // IPv6 hosts are concatenated without brackets, as upstream does.
        let c = resolve_transport(
            &MapEnv::from_pairs(&[("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1")]),
            "::1",
            None,
            None,
            0,
        )
        .unwrap();
        assert!(c.hostname.starts_with("::1:") && c.hostname.ends_with(":npu_0"));
    }

    #[test]
    fn ascend_flag_invalid_warns_and_is_off() {
        let c = resolve(&[("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "maybe")], None, None, 0).unwrap();
        assert_eq!(c.protocol, "rdma");
        assert_eq!(
            c.warnings,
            vec!["Invalid value for ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE: \"maybe\" is not a valid boolean value, using default \"False\"".to_owned()]
        );
    }

    #[test]
    fn explicit_protocol_beats_ascend_env_with_warning() {
        let c = resolve(&[("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1")], Some("tcp"), None, 0).unwrap();
        assert_eq!((c.protocol.as_str(), c.hostname.as_str()), ("tcp", "10.0.0.5"));
        assert_eq!(c.warnings.len(), 1);
        // Explicit "ascend" takes the Ascend path without the env flag.
        let c = resolve(&[], Some("ascend"), None, 4).unwrap();
        assert!(c.hostname.ends_with(":npu_4"));
    }

    #[test]
    fn forced_tcp_beats_ascend() {
        let c =
            resolve(&[("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1"), ("MC_FORCE_TCP", "1")], None, None, 0).unwrap();
        assert_eq!((c.protocol.as_str(), c.hostname.as_str()), ("tcp", "10.0.0.5"));
    }
}
