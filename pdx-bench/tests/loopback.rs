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

/// `--path tcp` keeps both processes on TCP loopback; `--path auto` (the
/// default) takes the same-host link, and says so in the JSON; an `auto`
/// run that ends on TCP says why in a WARNING line.
#[test]
fn the_path_asked_for_is_the_path_taken_and_reported() {
    let dir = std::env::temp_dir().join(format!("pdx-bench-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("p.json");
    let read = |path: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let blocks = ["--workload", "blocks", "--block", "64K", "--json", json.to_str().unwrap()];
    let out = run(&[&["--path", "tcp"][..], &blocks].concat());
    let v = read(&json);
    assert_eq!((v["path"].as_str(), v["path_requested"].as_str()), (Some("tcp"), Some("tcp")), "{v}");
    assert!(v["path_reason"].as_str().unwrap().contains("PDX_SAME_HOST=off"), "{v}");
    assert!(out.contains("data path to") && !out.contains("WARNING"), "{out}");
    // The table's header names the path that ran, as the last line does.
    assert!(out.contains("pdx Write over tcp (") && out.contains(": tcp (asked for tcp)"), "{out}");
    let out = run(&[&["--path", "auto"][..], &blocks].concat());
    let v = read(&json);
    assert_eq!((v["path"].as_str(), v["path_requested"].as_str()), (Some("same-host"), Some("auto")), "{v}");
    assert!(out.contains("byte for byte") && !out.contains("WARNING"), "{out}");
    assert!(out.contains("pdx Write over same-host (") && out.contains(": same-host (asked for auto)"), "{out}");
    // Turned off by the environment: auto ends on TCP, visibly.
    let out = Command::new(env!("CARGO_BIN_EXE_pdx-bench"))
        .env("PDX_SAME_HOST", "off")
        .args(["--quiet", "--buffer", "16M", "--duration", "0.1", "--total", "4M"])
        .args(blocks)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("WARNING: --path auto ended on TCP") && stdout.contains("PDX_SAME_HOST=off"), "{stdout}");
    assert_eq!(read(&json)["path"], "tcp");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--compare-paths` with tiny sizes: every workload row with every column,
/// both engines on the path they were meant to take, bytes verified.
#[test]
fn the_path_comparison_prints_every_column() {
    let dir = std::env::temp_dir().join(format!("pdx-bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("c.json");
    let out = Command::new(env!("CARGO_BIN_EXE_pdx-bench"))
        .args(["--quiet", "--compare-paths", "--compare-large", "1M", "--compare-block", "4K", "--compare-batch", "4"])
        .args(["--compare-small", "4K", "--rounds", "2", "--duration", "0.02", "--json", json.to_str().unwrap()])
        .output()
        .expect("pdx-bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "pdx-bench failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let header = stdout.lines().find(|l| l.starts_with("workload")).expect("a table header");
    for column in ["same-host", "tcp", "raw process_vm", "memcpy", "sh/raw", "sh/tcp"] {
        assert!(header.contains(column), "{header}");
    }
    for row in ["1 MiB write", "1 MiB read", "4 KiB x 4 write", "4 KiB x 4 read", "4 KiB write p50", "4 KiB read p50"] {
        let line = stdout.lines().find(|l| l.starts_with(row)).unwrap_or_else(|| panic!("no row {row}: {stdout}"));
        assert_eq!(line.matches("GB/s").count() + line.matches(" us").count(), 4, "{line}");
    }
    assert!(stdout.contains("verified: same-host and tcp") && !stdout.contains("WARNING"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["paths"]["same_host_engine"]["path"], "same-host", "{v}");
    assert_eq!(v["paths"]["tcp_engine"]["path"], "tcp", "{v}");
    assert!(v["paths"]["same_host_engine"]["same_host_bytes_written"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["paths"]["tcp_engine"]["same_host_bytes_written"], 0, "{v}");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    for row in rows {
        for key in ["same_host", "tcp", "raw_process_vm", "memcpy"] {
            assert!(row[key].as_f64().is_some_and(|x| x > 0.0), "{key} in {row}");
            assert_eq!(row[format!("{key}_per_round")].as_array().unwrap().len(), 2, "{row}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A target copies another process's memory on a `pvm` control message
/// only when started for `--compare-paths`, and only its parent's.
#[test]
fn raw_copies_are_only_for_the_parent_that_asked() {
    use std::io::BufRead;
    let engine = pdx::backend::start("127.0.0.1", Some("tcp"), None).unwrap();
    let source = vec![5u8; 4096];
    let ask = |flag: &[&str], pid: u32| -> String {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pdx-bench"))
            .args(["target", "--buffer", "64K"])
            .args(flag)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let target = v["session"].as_str().unwrap();
        let msg = format!("pvm {} {pid} write {} 4096 1 1 1 10 1", engine.session_id(), source.as_ptr() as u64);
        engine.notify(target, &pdx::transfer::Notification::new("pdx-bench", msg.as_str())).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let answer = loop {
            if let Some(note) = engine.drain_notifications().into_iter().find(|n| n.name == b"pdx-bench") {
                break String::from_utf8(note.msg).unwrap();
            }
            assert!(std::time::Instant::now() < deadline, "no answer");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        drop(child.stdin.take());
        let _ = child.kill();
        let _ = child.wait();
        answer
    };
    let me = std::process::id();
    assert!(ask(&[], me).starts_with("pvm-failed"), "without the flag");
    assert!(ask(&["--raw-copies-with-parent"], 1).starts_with("pvm-failed"), "another pid");
    let answer = ask(&["--raw-copies-with-parent"], me);
    assert!(answer.starts_with("pvm-done "), "{answer}");
}
