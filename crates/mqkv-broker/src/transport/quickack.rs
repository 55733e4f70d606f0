//! Acknowledging what a client sent at once.
//!
//! Linux delays the ACK of a segment that gets no answer (a client's PUBACK, PUBREC or
//! PINGREQ arrives and the broker has nothing to send back) by up to 40 ms, in the hope of
//! sending it along with data. A client that leaves Nagle's algorithm on (paho-mqtt, and
//! rumqttc unless told otherwise) holds its next small packet until that ACK comes: a client
//! that publishes at QoS 1 and receives on the same connection, as every state store client
//! does, then waited about 45 ms per request, over TCP, TLS and WebSocket alike. Asking for a
//! quick ACK sends the ACK at once; the kernel clears the request as it goes, so it is asked
//! for each time.
//!
//! It is asked for only after a read that brought nothing but acknowledgements the broker does
//! not answer (PUBACK, PUBCOMP): anything else gets an answer that carries the ACK. Asking after
//! every read cost a system call per read, 11 % of durable SET throughput at 64 clients (see
//! `docs/design/performance.md`). And it is asked for only on the connection of a client that
//! has published (see `connection::reading`): a client that only subscribes sends its next
//! acknowledgement in answer to the next delivery, which carries the ACK it waits for. Such a
//! client's other packets (a PINGREQ, a SUBSCRIBE) sent just after an acknowledgement may wait
//! for the delayed ACK, once each; so may its first PUBLISH, after which it gets quick ACKs.

#[cfg(target_os = "linux")]
pub(crate) fn ack_at_once(socket: std::os::fd::RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: the descriptor of a socket the caller's read half keeps open, and a pointer to
    // a live c_int with its size; the call reads nothing else.
    unsafe {
        libc::setsockopt(
            socket,
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Elsewhere there is no such request to make.
#[cfg(not(target_os = "linux"))]
pub(crate) fn ack_at_once(_socket: std::os::fd::RawFd) {}

/// True if `bytes` is one or more whole PUBACK or PUBCOMP packets and nothing else.
pub(crate) fn only_acknowledgements(mut bytes: &[u8]) -> bool {
    const PUBACK: u8 = 4;
    const PUBCOMP: u8 = 7;
    if bytes.is_empty() {
        return false;
    }
    while let Some((&first, rest)) = bytes.split_first() {
        if !matches!(first >> 4, PUBACK | PUBCOMP) {
            return false;
        }
        // The remaining length: a variable byte integer of at most four bytes.
        let mut length = 0usize;
        let mut used = 0;
        loop {
            let Some(&b) = rest.get(used) else {
                return false;
            };
            length |= usize::from(b & 0x7f) << (7 * used);
            used += 1;
            if b & 0x80 == 0 {
                break;
            }
            if used == 4 {
                return false;
            }
        }
        let Some(next) = rest.get(used + length..) else {
            return false;
        };
        bytes = next;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_puback_and_pubcomp_packets_count() {
        let puback = [0x40, 0x02, 0x00, 0x01];
        let puback_with_reason = [0x40, 0x03, 0x00, 0x02, 0x10];
        let pubcomp = [0x70, 0x02, 0x00, 0x03];
        assert!(only_acknowledgements(&puback));
        assert!(only_acknowledgements(
            &[&puback[..], &pubcomp, &puback_with_reason].concat()
        ));
        assert!(!only_acknowledgements(&[]), "nothing read");
        assert!(!only_acknowledgements(&puback[..3]), "cut short");
        let publish = [0x30, 0x03, 0x00, 0x01, b'a'];
        assert!(
            !only_acknowledgements(&[&puback[..], &publish].concat()),
            "a publish is answered"
        );
        assert!(
            !only_acknowledgements(&[0xc0, 0x00]),
            "a PINGREQ is answered"
        );
        assert!(
            !only_acknowledgements(&[0x40, 0xff, 0xff, 0xff, 0xff, 0x01]),
            "a length of five bytes"
        );
    }
}
