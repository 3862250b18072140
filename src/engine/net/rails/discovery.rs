//! This engine's rails: the interfaces that are up with an address, and
//! the ones `PDX_TCP_RAILS` names.

use std::net::IpAddr;

use super::{LOG_TARGET, MAX_RAILS};
use crate::error::{Error, Result};

/// One local interface address that carries lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalRail {
    /// The interface's name (`eth1`).
    pub name: String,
    pub addr: IpAddr,
    /// The subnet's prefix length.
    pub prefix: u8,
}

/// Every address of an interface that is up, not loopback, and not an IPv6
/// link-local address (those need a scope to be reached), as (interface,
/// address, prefix length).
pub fn interfaces() -> std::io::Result<Vec<LocalRail>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut found = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let flags = ifa.ifa_flags as libc::c_int;
        if flags & libc::IFF_UP == 0 || flags & libc::IFF_LOOPBACK != 0 || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: the address and mask point at sockaddrs of their family
        // (or are null), as getifaddrs documents.
        let (Some(addr), mask) = (unsafe { sockaddr_ip(ifa.ifa_addr) }, unsafe { sockaddr_ip(ifa.ifa_netmask) }) else {
            continue;
        };
        if matches!(addr, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80) {
            continue;
        }
        let prefix = match mask {
            Some(IpAddr::V4(m)) => u32::from(m).count_ones() as u8,
            Some(IpAddr::V6(m)) => u128::from(m).count_ones() as u8,
            None => {
                if addr.is_ipv4() {
                    32
                } else {
                    128
                }
            }
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        found.push(LocalRail { name, addr, prefix });
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(found)
}

/// The IP address in `sa`, for the IPv4 and IPv6 families.
///
/// # Safety
/// `sa` is null or points at a valid sockaddr of the size its family says.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-null and valid per the caller; the family decides the type.
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let v4 = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some(IpAddr::from(u32::from_be(v4.sin_addr.s_addr).to_be_bytes()))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let v6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            Some(IpAddr::from(v6.sin6_addr.s6_addr))
        }
        _ => None,
    }
}

/// This engine's rails for `spec` (`PDX_TCP_RAILS`): `None` or empty: none
/// (one address, as before); `auto`: every address [`interfaces`] finds;
/// else a comma list of interface names (all their addresses) or local
/// addresses, each of which must exist.
pub fn discover(spec: Option<&str>) -> Result<Vec<LocalRail>> {
    discover_from(spec, interfaces)
}

fn discover_from(spec: Option<&str>, list: impl FnOnce() -> std::io::Result<Vec<LocalRail>>) -> Result<Vec<LocalRail>> {
    let Some(spec) = spec.map(str::trim).filter(|s| !s.is_empty()) else { return Ok(Vec::new()) };
    let all = list().map_err(|e| Error::io(format!("PDX_TCP_RAILS: cannot list the interfaces: {e}")))?;
    let mut rails: Vec<LocalRail> = Vec::new();
    if spec == "auto" {
        rails = all;
        if rails.is_empty() {
            log::warn!(target: LOG_TARGET, "PDX_TCP_RAILS=auto: no interface is up with an address; one address, as without rails");
        }
    } else {
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let matched: Vec<LocalRail> = match item.parse::<IpAddr>() {
                Ok(ip) => all.iter().filter(|r| r.addr == ip).cloned().collect(),
                Err(_) => all.iter().filter(|r| r.name == item).cloned().collect(),
            };
            if matched.is_empty() {
                return Err(Error::invalid_argument(format!(
                    "PDX_TCP_RAILS: {item:?} is neither an interface that is up with an address nor one of its \
                     addresses (found: {})",
                    all.iter().map(|r| format!("{} {}", r.name, r.addr)).collect::<Vec<_>>().join(", ")
                )));
            }
            for r in matched {
                if !rails.contains(&r) {
                    rails.push(r);
                }
            }
        }
    }
    if rails.len() > MAX_RAILS {
        log::warn!(target: LOG_TARGET, "PDX_TCP_RAILS: {} rails found; using the first {MAX_RAILS}", rails.len());
        rails.truncate(MAX_RAILS);
    }
    Ok(rails)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rail(name: &str, addr: &str, prefix: u8) -> LocalRail {
        LocalRail { name: name.to_owned(), addr: addr.parse().unwrap(), prefix }
    }

    #[test]
    fn rails_are_found_by_auto_by_name_and_by_address() {
        let list = || Ok(vec![rail("eth0", "10.0.1.2", 24), rail("eth1", "10.0.2.2", 24), rail("eth1", "fd00::2", 64)]);
        assert!(discover_from(None, list).unwrap().is_empty());
        assert!(discover_from(Some(" "), list).unwrap().is_empty());
        assert_eq!(discover_from(Some("auto"), list).unwrap().len(), 3);
        let named = discover_from(Some("eth1"), list).unwrap();
        assert_eq!(named.iter().map(|r| r.addr.to_string()).collect::<Vec<_>>(), ["10.0.2.2", "fd00::2"]);
        let by_addr = discover_from(Some("10.0.1.2, eth0"), list).unwrap();
        assert_eq!(by_addr, vec![rail("eth0", "10.0.1.2", 24)], "one rail once");
        let e = discover_from(Some("eth9"), list).unwrap_err();
        assert!(e.message().contains("\"eth9\"") && e.message().contains("eth0 10.0.1.2"), "{e}");
    }

    #[test]
    fn the_real_interface_list_has_no_loopback() {
        let found = interfaces().unwrap();
        assert!(found.iter().all(|r| !r.addr.is_loopback()), "{found:?}");
    }
}
