//! pdx-demo: normalize an SGLang PD argv the way SGLang would, and show the
//! transport an engine would pick.
//!
//! Usage: `cargo run --release --bin pdx-demo -- [SGLANG FLAGS...]`
//! Without flags it uses a built-in `mooncake_tcp` decode example. Set
//! `RUST_LOG=info` to also see the log lines on stderr.

use pdx::config::{self, net, ProcessEnv, ServerArgs};

const EXAMPLE: &[&str] = &[
    "--model-path",
    "meta-llama/Llama-3.1-8B-Instruct",
    "--disaggregation-mode",
    "decode",
    "--disaggregation-transfer-backend",
    "mooncake_tcp",
    "--disaggregation-ib-device",
    "mlx5_0,mlx5_1",
    "--max-running-requests",
    "64",
    "--dp-size",
    "2",
];

fn main() {
    pdx::logging::init();
    let given: Vec<String> = std::env::args().skip(1).collect();
    let argv: Vec<String> = if given.is_empty() { EXAMPLE.iter().map(|s| (*s).to_owned()).collect() } else { given };
    println!("argv: {}", argv.join(" "));

    let mut args = ServerArgs::default();
    if let Err(e) = config::parse_argv(&mut args, &argv) {
        eprintln!("error ({:?}): {}", e.kind(), e.message());
        std::process::exit(1);
    }
    let messages = match config::normalize(&mut args, &ProcessEnv) {
        Ok(m) => m,
        Err(refusal) => {
            // What SGLang logs before it raises, then what it raises.
            for m in &refusal.messages {
                eprintln!("[{:?}] {}", m.level, m.text);
            }
            eprintln!("error ({:?}): {}", refusal.kind(), refusal.message());
            std::process::exit(1);
        }
    };

    println!("\nnormalized arguments (rules: {}):", args.pdx_rules.name());
    for (name, value) in args.entries() {
        println!("  {name:<46} {}", value.as_deref().unwrap_or("None"));
    }
    println!("\nmessages:");
    if messages.is_empty() {
        println!("  (none)");
    }
    for m in &messages {
        println!("  [{:?}] {}", m.level, m.text);
    }

    let host = "127.0.0.1";
    println!("\ntransport for an engine on {host}, GPU 0:");
    match config::resolve_transport_from_process_env(host, None, args.disaggregation_ib_device.as_deref(), 0) {
        Ok(c) => {
            println!("  protocol : {}", c.protocol);
            println!("  hostname : {}", c.hostname);
            println!("  device   : {:?}", c.device);
            println!("  reason   : {}", c.reason);
            for w in &c.warnings {
                println!("  warning  : {w}");
            }
            println!("  session id (rpc port 17000): {}", net::session_id(host, 17000));
        }
        Err(e) => {
            eprintln!("transport error ({:?}): {}", e.kind(), e.message());
            std::process::exit(1);
        }
    }
}
