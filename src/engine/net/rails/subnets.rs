//! A peer's advertised rails and ours, paired by subnet.

use std::net::IpAddr;

use super::discovery::LocalRail;
use super::MAX_RAILS;

/// Whether `a` and `b` are on one subnet of `prefix` bits.
fn same_subnet(a: IpAddr, b: IpAddr, prefix: u8) -> bool {
    match (a, b) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix.min(128))).unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// A peer's advertised rails, read leniently from its descriptor: at most
/// [`MAX_RAILS`] IP addresses; anything else is skipped.
pub fn parse_advertised(value: Option<&serde_json::Value>) -> Vec<IpAddr> {
    let Some(list) = value.and_then(serde_json::Value::as_array) else { return Vec::new() };
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in list.iter().filter_map(|v| v.as_str()?.parse::<IpAddr>().ok()) {
        if out.len() < MAX_RAILS && !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// Pair our rails with a peer's addresses: each remote address gets a
/// local rail on its subnet (the one fewest pairs use so far), else none
/// (the kernel routes it, from whichever address it picks).
pub fn pair(locals: &[LocalRail], remotes: &[IpAddr]) -> Vec<(Option<LocalRail>, IpAddr)> {
    let mut uses = vec![0usize; locals.len()];
    remotes
        .iter()
        .map(|&remote| {
            let best = (0..locals.len())
                .filter(|&i| same_subnet(locals[i].addr, remote, locals[i].prefix))
                .min_by_key(|&i| uses[i]);
            match best {
                Some(i) => {
                    uses[i] += 1;
                    (Some(locals[i].clone()), remote)
                }
                None => (None, remote),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rail(name: &str, addr: &str, prefix: u8) -> LocalRail {
        LocalRail { name: name.to_owned(), addr: addr.parse().unwrap(), prefix }
    }

    #[test]
    fn pairs_take_the_same_subnet_first_then_the_route() {
        let locals = [rail("a", "10.231.1.1", 24), rail("b", "10.231.2.1", 24)];
        let remotes: Vec<IpAddr> =
            ["10.231.2.2", "10.231.1.2", "10.9.9.9"].iter().map(|s| s.parse().unwrap()).collect();
        let pairs = pair(&locals, &remotes);
        assert_eq!(pairs[0].0.as_ref().map(|l| l.name.as_str()), Some("b"));
        assert_eq!(pairs[1].0.as_ref().map(|l| l.name.as_str()), Some("a"));
        assert_eq!(pairs[2].0, None, "no subnet in common: routed");
        assert!(same_subnet("10.1.2.3".parse().unwrap(), "10.1.200.1".parse().unwrap(), 16));
        assert!(!same_subnet("10.1.2.3".parse().unwrap(), "10.2.2.3".parse().unwrap(), 16));
        assert!(same_subnet("1.2.3.4".parse().unwrap(), "9.9.9.9".parse().unwrap(), 0));
        assert!(!same_subnet("10.1.2.3".parse().unwrap(), "fd00::1".parse().unwrap(), 0));
    }

    #[test]
    fn advertised_rails_are_read_leniently_and_bounded() {
        let v = serde_json::json!(["10.0.0.1", 7, "not an ip", "10.0.0.1", "fd00::1"]);
        assert_eq!(parse_advertised(Some(&v)).len(), 2);
        assert!(parse_advertised(Some(&serde_json::json!("10.0.0.1"))).is_empty());
        let many: Vec<String> = (0..40).map(|i| format!("10.0.0.{i}")).collect();
        assert_eq!(parse_advertised(Some(&serde_json::json!(many))).len(), MAX_RAILS);
    }
}
