//! Splitting a netlink datagram into its messages: the one splitter every socket reader in
//! `sync/` uses (requests, dumps and notifications alike). Pure.

use netlink_packet_core::{DecodeError, NetlinkBuffer};

/// The whole messages (header included) of one netlink datagram, in order. A part that is not
/// a whole message (shorter than a header, or a length field that is too small or runs past
/// the end: a truncated or corrupt datagram) is an error, and the last item.
///
/// Readers that have nothing to do with a broken tail stop there:
/// `messages(data).map_while(Result::ok)`.
pub fn messages(mut data: &[u8]) -> impl Iterator<Item = Result<&[u8], DecodeError>> {
    std::iter::from_fn(move || {
        if data.is_empty() {
            return None;
        }
        let len = match NetlinkBuffer::new_checked(data) {
            Ok(nl) => nl.length() as usize,
            Err(e) => {
                data = &[];
                return Some(Err(e));
            }
        };
        let msg = &data[..len];
        // Messages are 4-byte aligned inside a datagram (NLMSG_ALIGN).
        data = data.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some(Ok(msg))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink message of `len` bytes (header included) of type `kind`, padding left out.
    fn message(len: u32, kind: u16) -> Vec<u8> {
        let mut m = len.to_ne_bytes().to_vec();
        m.extend(kind.to_ne_bytes());
        m.resize(len as usize, 0);
        m
    }

    #[test]
    fn whole_messages_are_split_at_their_aligned_lengths() {
        let a = message(20, 1);
        let b = message(17, 2);
        let c = message(16, 3);
        let mut datagram = a.clone();
        datagram.extend(&b);
        datagram.extend([0; 3]); // NLMSG_ALIGN padding after the 17-byte message
        datagram.extend(&c);
        let parts: Vec<_> = messages(&datagram)
            .collect::<Result<_, _>>()
            .expect("splits");
        assert_eq!(parts, vec![a.as_slice(), b.as_slice(), c.as_slice()]);
        // The last message's padding may be missing.
        let parts: Vec<_> = messages(&datagram[..datagram.len() - 16 - 3]).collect();
        assert_eq!(parts.len(), 2);
        assert!(parts.iter().all(Result::is_ok));
        assert_eq!(messages(&[]).count(), 0);
    }

    #[test]
    fn a_broken_tail_is_an_error_and_the_last_item() {
        let a = message(16, 1);
        for tail in [
            vec![0x40, 0, 0, 0, 0],        // shorter than a header
            message(24, 2)[..20].to_vec(), // its length runs past the end
            message(16, 2)
                .iter()
                .enumerate()
                .map(|(i, &b)| if i == 0 { 8 } else { b })
                .collect(), // a length shorter than a header
        ] {
            let mut datagram = a.clone();
            datagram.extend(&tail);
            let parts: Vec<_> = messages(&datagram).collect();
            assert_eq!(parts.len(), 2, "{tail:?}");
            assert_eq!(parts[0].as_deref().ok(), Some(a.as_slice()));
            assert!(parts[1].is_err(), "{tail:?}");
            assert_eq!(messages(&datagram).map_while(Result::ok).count(), 1);
        }
    }
}
