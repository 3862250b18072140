//! The main job must keep working: a small loopback run, both operations,
//! every byte verified, JSON and SVG written.

use std::process::Command;

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_pdx-bench"))
        .args([
            "--quiet",
            "--buffer",
            "64M",
            "--duration",
            "0.2",
            "--total",
            "16M",
            "--kv-tokens",
            "256",
            "--kv-handoffs",
            "2",
        ])
        .args(args)
        .output()
        .expect("pdx-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "pdx-bench failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn loopback_write_and_read_verify_every_byte() {
    let dir = std::env::temp_dir().join(format!("pdx-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (json, svg) = (dir.join("r.json"), dir.join("r.svg"));
    let out = run(&["--block", "4K,1M", "--json", json.to_str().unwrap(), "--plot", svg.to_str().unwrap()]);
    assert!(out.contains("byte for byte") && out.contains("verified the last handoff"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["blocks"].as_array().unwrap().len(), 2);
    assert!(v["blocks"][0]["gb_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["kv"][0]["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<polyline"));
    let out = run(&["--op", "read", "--workload", "blocks", "--block", "64K"]);
    assert!(out.contains("byte for byte"), "{out}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_unavailable_protocol_fails_cleanly() {
    let out = Command::new(env!("CARGO_BIN_EXE_pdx-bench"))
        .args(["--quiet", "--buffer", "16M", "--protocol", "no-such-protocol", "--workload", "blocks"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-protocol"));
}
