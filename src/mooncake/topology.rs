//! The device list as Mooncake's NIC priority matrix.
//!
//! With `auto_discover` off (pdx installs exactly the resolved protocol),
//! Mooncake learns its devices from the first `installTransport` argument:
//! a JSON object mapping each memory location (`cpu:N`, `cuda:N`) to
//! `[[preferred devices], [other devices]]`. pdx lists the given devices as
//! preferred for every CPU NUMA node of this host and for GPUs 0..31, so any
//! registered region (location `*`) finds them.

use serde_json::{json, Map, Value};

/// GPU locations covered by the matrix (`cuda:0` .. `cuda:{N-1}`).
pub(crate) const GPU_LOCATIONS: usize = 32;

/// The device names of a comma list: trimmed, empties dropped, first
/// occurrence kept.
pub fn split_devices(device: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in device.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !out.iter().any(|x| x == d) {
            out.push(d.to_owned());
        }
    }
    out
}

/// NUMA node ids from `/sys/devices/system/node` (`[0]` when unreadable).
pub fn numa_nodes() -> Vec<u32> {
    let mut nodes: Vec<u32> = std::fs::read_dir("/sys/devices/system/node")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    nodes.sort_unstable();
    if nodes.is_empty() {
        nodes.push(0);
    }
    nodes
}

/// The matrix for `devices` (None when the list is empty: Mooncake then
/// discovers devices itself).
pub fn nic_priority_matrix(devices: &[String], nodes: &[u32]) -> Option<String> {
    if devices.is_empty() {
        return None;
    }
    let entry = json!([devices, Vec::<String>::new()]);
    let mut m = Map::new();
    for n in nodes {
        m.insert(format!("cpu:{n}"), entry.clone());
    }
    for g in 0..GPU_LOCATIONS {
        m.insert(format!("cuda:{g}"), entry.clone());
    }
    Some(Value::Object(m).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_become_preferred_everywhere() {
        assert_eq!(split_devices(" mlx5_0, ,mlx5_1,mlx5_0 "), vec!["mlx5_0", "mlx5_1"]);
        assert!(nic_priority_matrix(&[], &[0]).is_none());
        let m = nic_priority_matrix(&split_devices("mlx5_0,mlx5_1"), &[0, 1]).unwrap();
        let v: Value = serde_json::from_str(&m).unwrap();
        assert_eq!(v["cpu:0"], json!([["mlx5_0", "mlx5_1"], []]));
        assert_eq!(v["cpu:1"], v["cpu:0"]);
        assert_eq!(v["cuda:31"], v["cpu:0"]);
        assert!(v.get("cpu:2").is_none() && v.get("cuda:32").is_none());
        assert!(!numa_nodes().is_empty());
    }
}
