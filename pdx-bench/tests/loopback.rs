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
    // The KV workload plans through pdx_kv_plan_new and can stream layer by layer.
    let out = run(&["--workload", "kv", "--layerwise", "--layer-compute-us", "100", "--json", json.to_str().unwrap()]);
    assert!(out.contains("layer-wise (36 layers") && out.contains("verified the last handoff"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let kv = &v["kv"][0];
    assert_eq!(kv["buffers"], 72);
    assert!(kv["requests"].as_u64().unwrap() >= 72 && kv["requests"].as_u64().unwrap() <= 72 * 16);
    assert!(kv["layerwise_tail_p50_s"].as_f64().unwrap() > 0.0 && kv["planning_p50_s"].as_f64().unwrap() > 0.0);
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

/// `--location` / `--remote-location cuda:N` against the CUDA driver
/// stand-in (compiled here from c_tests/cuda_double), side by side with host
/// memory; both sweeps verify every byte.
#[test]
fn device_memory_on_both_sides_against_the_driver_stand_in() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let source = root.join("c_tests/cuda_double/cuda_double.c");
    let dir = std::env::temp_dir().join(format!("pdx-bench-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = dir.join("libcuda_double.so");
    let built = Command::new("cc")
        .args(["-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-o"])
        .arg(&lib)
        .arg(&source)
        .arg("-lpthread")
        .status();
    if !matches!(built, Ok(s) if s.success()) {
        println!("SKIP: no C compiler to build the CUDA driver stand-in");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_pdx-bench"))
        .env("PDX_CUDA_LIB", &lib)
        .args(["--quiet", "--buffer", "32M", "--duration", "0.2", "--total", "8M", "--workload", "blocks"])
        .args(["--block", "64K,1M", "--location", "cuda:0", "--remote-location", "cuda:3", "--compare-host"])
        .output()
        .expect("pdx-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "pdx-bench failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.matches("byte for byte").count(), 2, "{stdout}");
    assert!(stdout.contains("local cuda:0 remote cuda:3"), "{stdout}");
    assert!(stdout.contains("staged (cuda:0 -> cuda:3) against host memory"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.trim_end().ends_with('%')).count(), 2, "{stdout}");
    // A device location without a driver is refused with the cause.
    let out = Command::new(env!("CARGO_BIN_EXE_pdx-bench"))
        .env("PDX_CUDA_LIB", dir.join("missing.so"))
        .args(["--quiet", "--buffer", "8M", "--workload", "blocks", "--block", "64K", "--location", "cuda:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.so"), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&dir).ok();
}
