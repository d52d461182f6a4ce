//! Which addresses an HTTPS destination may be connected to: the check the
//! destinations' resolver makes on every address a name resolves to, at
//! connect time, and on an address written in a URL.
//!
//! Refused unless the destination allows private networks
//! (`allow_private`): loopback (127.0.0.0/8, `::1`), private (10/8,
//! 172.16/12, 192.168/16, IPv6 unique local fc00::/7), link-local
//! (169.254/16, fe80::/10) and carrier-grade NAT (100.64/10). Refused
//! always: the cloud metadata and credential endpoints (169.254.169.254,
//! 169.254.170.2, 169.254.170.23, fd00:ec2::254, fd00:ec2::23), unspecified,
//! broadcast, multicast, documentation and reserved ranges. IPv4 written in
//! IPv6 (mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`) is judged as the IPv4
//! address it carries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is refused, or `None`: it may be connected to.
pub fn refused(ip: IpAddr, allow_private: bool) -> Option<&'static str> {
    let (why, private) = class(ip)?;
    if private && allow_private { None } else { Some(why) }
}

/// What an address is, when it is not a public one: (what, whether
/// `allow_private` lets it through).
fn class(ip: IpAddr) -> Option<(&'static str, bool)> {
    match ip {
        IpAddr::V4(v4) => class_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return class_v4(v4);
            }
            class_v6(v6)
        }
    }
}

const METADATA_V4: [Ipv4Addr; 3] =
    [Ipv4Addr::new(169, 254, 169, 254), Ipv4Addr::new(169, 254, 170, 2), Ipv4Addr::new(169, 254, 170, 23)];

fn class_v4(ip: Ipv4Addr) -> Option<(&'static str, bool)> {
    let [a, b, c, _] = ip.octets();
    if METADATA_V4.contains(&ip) {
        return Some(("a cloud metadata address", false));
    }
    Some(match (a, b, c) {
        (0, _, _) => ("an unspecified address (0.0.0.0/8)", false),
        (127, _, _) => ("a loopback address (127.0.0.0/8)", true),
        (10, _, _) => ("a private address (10.0.0.0/8)", true),
        (172, 16..=31, _) => ("a private address (172.16.0.0/12)", true),
        (192, 168, _) => ("a private address (192.168.0.0/16)", true),
        (169, 254, _) => ("a link-local address (169.254.0.0/16)", true),
        (100, 64..=127, _) => ("a carrier-grade NAT address (100.64.0.0/10)", true),
        (192, 0, 0) => ("an IETF protocol address (192.0.0.0/24)", false),
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => ("a documentation address", false),
        (198, 18..=19, _) => ("a benchmarking address (198.18.0.0/15)", false),
        (224..=239, _, _) => ("a multicast address", false),
        (240..=255, _, _) => ("a reserved or broadcast address", false),
        _ => return None,
    })
}

/// The IPv4 address an IPv6 one carries: mapped (`::ffff:0:0/96`) or NAT64
/// (`64:ff9b::/96`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = ip.segments();
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., a, b, c, d] = ip.octets();
        return Some(Ipv4Addr::new(a, b, c, d));
    }
    None
}

fn class_v6(ip: Ipv6Addr) -> Option<(&'static str, bool)> {
    let s = ip.segments();
    if s[0] == 0xfd00 && s[1] == 0x0ec2 && s[2..7] == [0, 0, 0, 0, 0] && matches!(s[7], 0x254 | 0x23) {
        return Some(("a cloud metadata address", false));
    }
    Some(if ip.is_unspecified() {
        ("the unspecified address (::)", false)
    } else if ip.is_loopback() {
        ("a loopback address (::1)", true)
    } else if s[0] & 0xffc0 == 0xfe80 {
        ("a link-local address (fe80::/10)", true)
    } else if s[0] & 0xfe00 == 0xfc00 {
        ("a unique local address (fc00::/7)", true)
    } else if s[0] & 0xff00 == 0xff00 {
        ("a multicast address (ff00::/8)", false)
    } else if s[0] == 0x2001 && s[1] == 0x0db8 {
        ("a documentation address (2001:db8::/32)", false)
    } else if s[..6] == [0; 6] {
        // ::a.b.c.d (IPv4-compatible, deprecated) and the rest of ::/96.
        ("a reserved address (::/96)", false)
    } else {
        return None;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn private_link_local_loopback_and_metadata_are_refused_public_ones_pass() {
        for (addr, private) in [
            ("169.254.169.254", false),
            ("169.254.170.2", false),
            ("fd00:ec2::254", false),
            ("::ffff:169.254.169.254", false),
            ("64:ff9b::a9fe:a9fe", false),
            ("0.0.0.0", false),
            ("255.255.255.255", false),
            ("224.0.0.1", false),
            ("::", false),
            ("ff02::1", false),
            ("10.1.2.3", true),
            ("172.16.0.1", true),
            ("172.31.255.255", true),
            ("192.168.1.1", true),
            ("127.0.0.1", true),
            ("127.8.9.10", true),
            ("169.254.1.1", true),
            ("100.64.0.1", true),
            ("::1", true),
            ("fe80::1", true),
            ("fe80::1ff:fe23:4567:890a", true),
            ("fd12:3456::1", true),
            ("::ffff:10.0.0.1", true),
            ("::ffff:127.0.0.1", true),
        ] {
            assert!(refused(ip(addr), false).is_some(), "{addr} refused");
            assert_eq!(refused(ip(addr), true).is_none(), private, "{addr} with allow_private");
        }
        for addr in ["93.184.216.34", "8.8.8.8", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert_eq!(refused(ip(addr), false), None, "{addr}");
        }
    }
}
