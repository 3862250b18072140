//! Transport resolution: which Mooncake protocol, hostname and device an
//! engine should initialize with, and why.
//!
//! Two of SGLang's engine-start rules ([`DeviceRule`]):
//!
//! - **shared** (`MooncakeTransferEngine.__init__` / `initialize`, after PR
//!   #25083), the default:
//!   1. The requested protocol: the explicit argument, else `"ascend"` when
//!      `ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE` is true, else
//!      `MOONCAKE_PROTOCOL` (default `"rdma"`, used verbatim).
//!   2. The device, unless `MC_FORCE_TCP` is exactly `1` (SGLang then passes
//!      `""` without looking at it): `get_ib_devices_for_gpu(device, gpu_id)`
//!      (`""` when none: Mooncake auto-discovers); a mapping without that GPU
//!      is SGLang's `ValueError`.
//!   3. For `"ascend"` the hostname becomes
//!      `host:{free_port}:npu_{ASCEND_NPU_PHY_ID, or gpu_id when -1}`.
//! - **remote instance** (`remote_instance_init_transfer_engine`): protocol
//!   explicit, else `MOONCAKE_PROTOCOL`; device the argument as given, else
//!   `MOONCAKE_DEVICE` (default `""`), verbatim; the hostname unchanged.
//!
//! Either way the protocol must be one of [`KNOWN_PROTOCOLS`] (else
//! `UnknownProtocol`), and Mooncake's own reading of `MC_FORCE_TCP` comes
//! last: present (any value) → protocol `"tcp"`, device `""`, hostname
//! unchanged; a false-looking value (`0`, `false`, `no`, `n`, `""`) adds a
//! warning, because it does not turn the forcing off.

use super::efa;
use super::engine_options::DeviceRule;
use super::env::{self, names, Env, ProcessEnv};
use super::ib_device::ib_devices_for_gpu_with_origin;
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
    /// The GPU the choice was made for (0 when not given, as SGLang does).
    pub gpu_id: i64,
    /// The rule that chose the device.
    pub rule: DeviceRule,
    /// Why: the protocol's source, then the device's (which rule, which GPU
    /// entry).
    pub reason: String,
    /// Warnings about the environment (e.g. a false-looking `MC_FORCE_TCP`,
    /// unparsable Ascend variables).
    pub warnings: Vec<String>,
}

fn is_false_looking(value: &str) -> bool {
    value.is_empty() || env::parse_bool(value) == Ok(false)
}

/// Decide protocol, hostname and device for an engine on `hostname` under
/// the shared rule. A negative `gpu_id` means "not given" (GPU 0, like
/// SGLang's `gpu_id=None`). See [`resolve_transport_for`].
pub fn resolve_transport(
    env: &dyn Env,
    hostname: &str,
    protocol: Option<&str>,
    device: Option<&str>,
    gpu_id: i32,
) -> Result<TransportChoice> {
    let gpu_id = (gpu_id >= 0).then_some(i64::from(gpu_id));
    resolve_transport_for(env, hostname, protocol, device, gpu_id, DeviceRule::Shared)
}

/// Decide protocol, hostname and device for an engine on `hostname`.
///
/// `protocol` / `device` are the caller's explicit choices (`None` = not
/// given); under [`DeviceRule::Shared`] `device` may be a comma list, an
/// inline JSON mapping or a `.json` file (see [`crate::config::ib_device`]).
/// `gpu_id` `None` counts as GPU 0.
///
/// Errors: `UnknownProtocol` (message lists [`KNOWN_PROTOCOLS`]); the IB
/// configuration errors of `get_ib_devices_for_gpu`, SGLang's texts
/// unchanged; `Io` when no free port can be found for the Ascend hostname;
/// under the shared rule with protocol `efa`, the `ValueError`s of sglang
/// 0.5.23's EFA allocator guard ([`efa::check_allocator_for`]).
pub fn resolve_transport_for(
    env: &dyn Env,
    hostname: &str,
    protocol: Option<&str>,
    device: Option<&str>,
    gpu_id: Option<i64>,
    rule: DeviceRule,
) -> Result<TransportChoice> {
    let gpu_given = gpu_id.is_some();
    let gpu_id = gpu_id.unwrap_or(0);
    let gpu_text = if gpu_given { format!("gpu_id {gpu_id}") } else { "gpu_id 0 (not given)".to_owned() };
    let mut warnings = Vec::new();

    let ascend = match rule {
        DeviceRule::Shared => {
            let a = env::get_bool(env, names::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE, false);
            warnings.extend(a.warning);
            a.value
        }
        DeviceRule::RemoteInstance => false,
    };
    let (requested, source) = match protocol {
        Some(p) => {
            if ascend && p != "ascend" {
                warnings.push(format!(
                    "{} is true, but the explicit protocol '{p}' takes precedence over the Ascend path",
                    names::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE
                ));
            }
            (p.to_owned(), "the explicit protocol argument".to_owned())
        }
        None if ascend => ("ascend".to_owned(), format!("{} is true", names::ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE)),
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

    let force = env.var(names::MC_FORCE_TCP);
    // The device each rule picks, and where it came from.
    let (device, device_why) = match rule {
        DeviceRule::Shared if force.as_deref() == Some("1") => (
            String::new(),
            format!("no IB device: SGLang's shared-engine rule passes \"\" when MC_FORCE_TCP=1 ({gpu_text})"),
        ),
        DeviceRule::Shared => match ib_devices_for_gpu_with_origin(device, gpu_id)? {
            None => {
                (String::new(), format!("no device given, Mooncake auto-discovers (shared-engine rule, {gpu_text})"))
            }
            Some((d, origin)) => {
                let why = format!("device '{d}': {} (shared-engine rule, {gpu_text})", origin.describe());
                (d, why)
            }
        },
        DeviceRule::RemoteInstance => match device {
            Some(d) => (d.to_owned(), format!("device '{d}' as given, verbatim (remote-instance rule)")),
            None => {
                let d = env::get_str(env, names::MOONCAKE_DEVICE, "");
                let why = match env.var(names::MOONCAKE_DEVICE) {
                    Some(_) => format!("device '{d}' from MOONCAKE_DEVICE, verbatim (remote-instance rule)"),
                    None => {
                        "MOONCAKE_DEVICE unset: device '' (remote-instance rule; Mooncake auto-discovers)".to_owned()
                    }
                };
                (d, why)
            }
        },
    };

    if let Some(force) = force {
        if is_false_looking(&force) {
            warnings.push(format!(
                "MC_FORCE_TCP={force:?} looks false, but Mooncake forces the TCP transport whenever MC_FORCE_TCP is set; unset it to allow '{requested}'"
            ));
        }
        let dropped = if device.is_empty() { String::new() } else { format!(" ('{device}' is not used)") };
        return Ok(TransportChoice {
            protocol: "tcp".to_owned(),
            hostname: hostname.to_owned(),
            device: String::new(),
            gpu_id,
            rule,
            reason: format!("MC_FORCE_TCP is set (value {force:?}): Mooncake forces TCP; requested '{requested}' from {source} is overridden and no IB device is selected{dropped}; {device_why}"),
            warnings,
        });
    }

    if requested == "ascend" && rule == DeviceRule::Shared {
        let phy = env::get_int(env, names::ASCEND_NPU_PHY_ID, Some(-1));
        warnings.extend(phy.warning);
        let phy = phy.value.unwrap_or(-1);
        let npu = if phy == -1 { gpu_id } else { phy };
        let port = net::free_port()?;
        return Ok(TransportChoice {
            protocol: "ascend".to_owned(),
            hostname: format!("{hostname}:{port}:npu_{npu}"),
            device,
            gpu_id,
            rule,
            reason: format!(
                "protocol 'ascend' from {source}; hostname gets a free port and npu_{npu} ({}); {device_why}",
                if phy == -1 { "gpu_id, ASCEND_NPU_PHY_ID is -1" } else { "ASCEND_NPU_PHY_ID" }
            ),
            warnings,
        });
    }
    if rule == DeviceRule::Shared {
        // sglang 0.5.23 refuses CUDA VMM allocations under EFA before its KV
        // manager starts the shared engine; pdx refuses them where that
        // engine starts.
        efa::check_allocator_for(env, &requested)?;
    }
    Ok(TransportChoice {
        protocol: requested.clone(),
        hostname: hostname.to_owned(),
        device,
        gpu_id,
        rule,
        reason: format!("protocol '{requested}' from {source}; {device_why}"),
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

    fn resolve_rule(
        pairs: &[(&str, &str)],
        device: Option<&str>,
        gpu: Option<i64>,
        rule: DeviceRule,
    ) -> Result<TransportChoice> {
        resolve_transport_for(&MapEnv::from_pairs(pairs), "10.0.0.5", None, device, gpu, rule)
    }

    /// One engine per GPU: SGLang's `get_ib_devices_for_gpu(ib_device,
    /// self.gpu_id)` (mooncake_transfer_engine.py at d4801be, line 130) for
    /// each of 8 GPUs, inline and from a file; the reason names the entry.
    #[test]
    fn eight_gpu_mapping_inline_and_file() {
        let map =
            format!("{{{}}}", (0..8).map(|g| format!("\"{g}\": \"mlx5_{}\"", 7 - g)).collect::<Vec<_>>().join(", "));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ib.json");
        std::fs::write(&file, &map).unwrap();
        let file = file.to_str().unwrap().to_owned();
        for g in 0..8 {
            let c = resolve_rule(&[], Some(&map), Some(g), DeviceRule::Shared).unwrap();
            assert_eq!(c.device, format!("mlx5_{}", 7 - g));
            assert_eq!(
                c.reason,
                format!("protocol 'rdma' from the default (MOONCAKE_PROTOCOL unset); device 'mlx5_{}': entry {g} of the inline per-GPU JSON mapping (shared-engine rule, gpu_id {g})", 7 - g)
            );
            let c = resolve_rule(&[], Some(&file), Some(g), DeviceRule::Shared).unwrap();
            assert_eq!(c.device, format!("mlx5_{}", 7 - g));
            assert!(c.reason.contains(&format!("entry {g} of the per-GPU mapping in {file}")), "{}", c.reason);
        }
        let c = resolve_rule(&[], Some(&map), None, DeviceRule::Shared).unwrap();
        assert_eq!(c.device, "mlx5_7");
        assert!(c.reason.ends_with("(shared-engine rule, gpu_id 0 (not given))"), "{}", c.reason);
        // A GPU the mapping lacks: exactly SGLang's ValueError, nothing
        // prepended (line 99-100 of the same file).
        for device in [map.as_str(), file.as_str()] {
            let e = resolve_rule(&[], Some(device), Some(8), DeviceRule::Shared).unwrap_err();
            assert_eq!(
                (e.kind(), e.message()),
                (ErrorKind::ValueError, "No IB devices configured for GPU 8. Available GPUs: [0, 1, 2, 3, 4, 5, 6, 7]")
            );
        }
    }

    /// SGLang skips the device only when `os.environ.get("MC_FORCE_TCP") ==
    /// "1"` (mooncake_transfer_engine.py at d4801be, line 127); any other
    /// value still resolves it, errors included.
    #[test]
    fn only_mc_force_tcp_1_skips_the_device() {
        let map = r#"{"0": "mlx5_0"}"#;
        let c = resolve_rule(&[("MC_FORCE_TCP", "1")], Some(map), Some(5), DeviceRule::Shared).unwrap();
        assert_eq!((c.protocol.as_str(), c.device.as_str()), ("tcp", ""));
        let e = resolve_rule(&[("MC_FORCE_TCP", "0")], Some(map), Some(5), DeviceRule::Shared).unwrap_err();
        assert_eq!(e.message(), "No IB devices configured for GPU 5. Available GPUs: [0]");
        let c = resolve_rule(&[("MC_FORCE_TCP", "yes")], Some(map), Some(0), DeviceRule::Shared).unwrap();
        assert_eq!((c.protocol.as_str(), c.device.as_str()), ("tcp", ""));
        assert!(c.reason.contains("('mlx5_0' is not used)"), "{}", c.reason);
    }

    /// `MOONCAKE_DEVICE` is read exactly when the remote-instance rule
    /// applies and no device is given: `initialize(..., envs.MOONCAKE_PROTOCOL.get(),
    /// envs.MOONCAKE_DEVICE.get())` (model_runner_components/
    /// remote_instance_weight_transporter.py at d4801be, line 49).
    #[test]
    fn mooncake_device_only_under_the_remote_instance_rule() {
        let env = [("MOONCAKE_DEVICE", "mlx5_9"), ("ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE", "1")];
        let c = resolve_rule(&env, None, Some(3), DeviceRule::RemoteInstance).unwrap();
        assert_eq!((c.protocol.as_str(), c.hostname.as_str(), c.device.as_str()), ("rdma", "10.0.0.5", "mlx5_9"));
        assert_eq!(c.rule, DeviceRule::RemoteInstance);
        assert!(
            c.reason.ends_with("device 'mlx5_9' from MOONCAKE_DEVICE, verbatim (remote-instance rule)"),
            "{}",
            c.reason
        );
        // Given a device, the rule uses it verbatim (no mapping lookup).
        let c = resolve_rule(&env, Some(r#"{"0": "x"}"#), Some(3), DeviceRule::RemoteInstance).unwrap();
        assert_eq!(c.device, r#"{"0": "x"}"#);
        // Unset: "" (EnvStr's default).
        let c = resolve_rule(&[], None, None, DeviceRule::RemoteInstance).unwrap();
        assert_eq!(c.device, "");
        assert!(c.reason.contains("MOONCAKE_DEVICE unset"));
        // The shared rule never reads it.
        let c = resolve_rule(&[("MOONCAKE_DEVICE", "mlx5_9")], None, Some(3), DeviceRule::Shared).unwrap();
        assert_eq!(c.device, "");
        assert!(!c.reason.contains("MOONCAKE_DEVICE"));
        let c = resolve_rule(&[("MOONCAKE_DEVICE", "mlx5_9")], Some("mlx5_1"), Some(3), DeviceRule::Shared).unwrap();
        assert_eq!(c.device, "mlx5_1");
        assert!(c.reason.contains("one device list shared by all GPUs"));
        // The protocol follows MOONCAKE_PROTOCOL; MC_FORCE_TCP still forces tcp.
        let c = resolve_rule(&[("MOONCAKE_PROTOCOL", "efa")], None, None, DeviceRule::RemoteInstance).unwrap();
        assert_eq!(c.protocol, "efa");
        let c =
            resolve_rule(&[("MC_FORCE_TCP", "1"), ("MOONCAKE_DEVICE", "m")], None, None, DeviceRule::RemoteInstance)
                .unwrap();
        assert_eq!((c.protocol.as_str(), c.device.as_str()), ("tcp", ""));
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
