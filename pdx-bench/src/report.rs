//! Results: latency percentiles, the console table, JSON and an SVG plot of
//! throughput against block size.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

/// One measured configuration.
#[derive(Debug, Clone)]
pub struct Row {
    pub label: String,
    pub block: usize,
    pub batch: usize,
    pub threads: usize,
    pub ops: usize,
    pub bytes: u64,
    pub elapsed: Duration,
    /// Per-call latencies, sorted.
    pub latencies: Vec<Duration>,
}

impl Row {
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }

    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let idx = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[idx.min(self.latencies.len() - 1)]
    }

    pub fn to_json(&self) -> Value {
        json!({
            "label": self.label, "block_bytes": self.block, "batch": self.batch, "threads": self.threads,
            "ops": self.ops, "bytes": self.bytes, "seconds": self.elapsed.as_secs_f64(),
            "gb_per_s": self.gbps(), "ops_per_s": self.ops_per_sec(),
            "p50_us": self.percentile(0.5).as_secs_f64() * 1e6, "p99_us": self.percentile(0.99).as_secs_f64() * 1e6,
        })
    }
}

/// `4 KiB`, `64 MiB`, ...
pub fn human_bytes(n: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 && (v / 1024.0).fract() == 0.0 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

/// Parse `4K`, `64KiB`, `1M`, `2G`, `123`.
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    let t = text.trim().to_ascii_uppercase();
    let t = t.trim_end_matches("IB").trim_end_matches('B');
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{text:?} is not a size (e.g. 4K, 64KiB, 1M, 2G)"))
}

fn us(d: Duration) -> String {
    let u = d.as_secs_f64() * 1e6;
    if u >= 10_000.0 {
        format!("{:.1} ms", u / 1000.0)
    } else {
        format!("{u:.0} us")
    }
}

pub fn print_table(title: &str, rows: &[Row]) {
    println!("\n{title}");
    println!(
        "{:<10} {:>10} {:>6} {:>8} {:>9} {:>10} {:>10} {:>11}",
        "workload", "block", "batch", "threads", "GB/s", "p50/op", "p99/op", "ops/s"
    );
    for r in rows {
        println!(
            "{:<10} {:>10} {:>6} {:>8} {:>9.3} {:>10} {:>10} {:>11.0}",
            r.label,
            human_bytes(r.block),
            r.batch,
            r.threads,
            r.gbps(),
            us(r.percentile(0.5)),
            us(r.percentile(0.99)),
            r.ops_per_sec()
        );
    }
}

/// Host and staged sweeps side by side, block by block.
pub fn print_comparison(title: &str, host: &[Row], staged: &[Row]) {
    println!("\n{title}");
    println!("{:>10} {:>6} {:>12} {:>12} {:>8}", "block", "batch", "host GB/s", "staged GB/s", "ratio");
    for s in staged {
        let Some(h) = host.iter().find(|h| h.block == s.block && h.batch == s.batch) else { continue };
        println!(
            "{:>10} {:>6} {:>12.3} {:>12.3} {:>7.0}%",
            human_bytes(s.block),
            s.batch,
            h.gbps(),
            s.gbps(),
            100.0 * s.gbps() / h.gbps().max(1e-9)
        );
    }
}

/// An SVG line chart of GB/s against block size (log2 x axis).
pub fn svg_plot(title: &str, rows: &[Row]) -> String {
    let (w, h, left, bottom, top, right) = (720.0, 420.0, 70.0, 60.0, 40.0, 45.0);
    let pts: Vec<(f64, f64, usize)> = rows.iter().map(|r| ((r.block as f64).log2(), r.gbps(), r.block)).collect();
    let (xmin, xmax) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let ymax = pts.iter().fold(0.0f64, |m, p| m.max(p.1)).max(0.001) * 1.15;
    let xspan = (xmax - xmin).max(1.0);
    let sx = |x: f64| left + (x - xmin) / xspan * (w - left - right);
    let sy = |y: f64| h - bottom - y / ymax * (h - bottom - top);
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>
<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>
<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>
<text x="{}" y="{}" text-anchor="middle">block size</text>
<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">GB/s</text>
"##,
        w / 2.0,
        xml_escape(title),
        h - bottom,
        w - right,
        h - bottom,
        h - bottom,
        (left + w - right) / 2.0,
        h - 18.0,
        (top + h - bottom) / 2.0,
        (top + h - bottom) / 2.0
    );
    for i in 0..=4 {
        let y = ymax * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{0}" x2="{1}" y2="{0}" stroke="#ddd"/><text x="{2}" y="{3}" text-anchor="end">{y:.2}</text>"##,
            sy(y),
            w - right,
            left - 6.0,
            sy(y) + 4.0
        );
    }
    for p in &pts {
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle">{}</text><circle cx="{}" cy="{}" r="4" fill="#1f77b4"/><text x="{}" y="{}" text-anchor="middle" font-size="10">{:.2}</text>"##,
            sx(p.0),
            h - bottom + 16.0,
            human_bytes(p.2),
            sx(p.0),
            sy(p.1),
            sx(p.0),
            sy(p.1) - 8.0,
            p.1
        );
    }
    let path: Vec<String> = pts.iter().map(|p| format!("{:.1},{:.1}", sx(p.0), sy(p.1))).collect();
    let _ = writeln!(s, r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##, path.join(" "));
    s.push_str("</svg>\n");
    s
}

fn xml_escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The initiator engine's counters after the run, and what keeping them costs.
pub fn print_stats(s: &pdx::transfer::stats::StatsSnapshot, cost: Duration) {
    println!(
        "\nengine stats: {} write and {} read tasks ({} / {} bytes), {} failed; task latency p50 {} us, p99 {} us",
        s.tasks_written,
        s.tasks_read,
        s.bytes_written,
        s.bytes_read,
        s.tasks_failed,
        s.latency_p50_us,
        s.latency_p99_us
    );
    println!("counting one completed task costs {:.1} ns (measured here, single thread)", cost.as_secs_f64() * 1e9);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_bytes("4K").unwrap(), 4096);
        assert_eq!(parse_bytes("64KiB").unwrap(), 65536);
        assert_eq!(parse_bytes("1m").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("3").unwrap(), 3);
        assert!(parse_bytes("0").is_err() && parse_bytes("x").is_err() && parse_bytes("99999999999G").is_err());
        assert_eq!(human_bytes(65536), "64 KiB");
        assert_eq!(human_bytes(1000), "1000 B");
    }

    #[test]
    fn percentiles_and_plot() {
        let r = Row {
            label: "w".into(),
            block: 4096,
            batch: 1,
            threads: 1,
            ops: 100,
            bytes: 1 << 30,
            elapsed: Duration::from_secs(1),
            latencies: (1..=100).map(Duration::from_micros).collect(),
        };
        assert_eq!(r.percentile(0.5), Duration::from_micros(51));
        assert_eq!(r.percentile(0.99), Duration::from_micros(99));
        let svg = svg_plot("t", &[r.clone(), Row { block: 1 << 20, ..r }]);
        assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.trim_end().ends_with("</svg>"));
    }
}
