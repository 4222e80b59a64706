//! A network device's ifindex, name and MAC address, looked up with plain system calls
//! (`if_nametoindex`, `if_indextoname`, `SIOCGIFHWADDR`), no netlink: what every reader in
//! `sync/` (links, bridges, VLAN devices, PPPoE) and the daemon's startup ask of a device they
//! know by name or index.

/// MAC address of the interface called `name` (`SIOCGIFHWADDR`, the address rtnetlink reports
/// as `IFLA_ADDRESS`), if it exists and has one.
pub fn hw_addr(name: &str) -> Option<[u8; 6]> {
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: a plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: ifreq is plain old data; all zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: fd is a socket, req a valid ifreq with a NUL-terminated name.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req) };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return None;
    }
    // SAFETY: SIOCGIFHWADDR filled the ifru_hwaddr member.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    if sa.sa_family != libc::ARPHRD_ETHER {
        return None;
    }
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(sa.sa_data) {
        *d = s as u8;
    }
    Some(mac)
}

/// ifindex of the interface called `name`, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: c is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// Name of the interface with index `ifindex`, if it exists.
pub fn name(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IFNAMSIZ];
    // SAFETY: buf has IF_NAMESIZE bytes, as if_indextoname requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_device_is_found_by_name_and_index() {
        let lo = ifindex("lo").expect("every network namespace has lo");
        assert_eq!(name(lo).as_deref(), Some("lo"));
        // Loopback's hardware type is not Ethernet: no MAC address.
        assert_eq!(hw_addr("lo"), None);
        assert_eq!(ifindex("no-such-device"), None);
        assert_eq!(hw_addr(&"x".repeat(libc::IFNAMSIZ)), None);
    }
}
