//! What a client's certificate chain says about it: any bytes, cut into a chain of DER
//! certificates, give an identity or none, never a panic; an identity keeps the first
//! certificate's bytes and names no more issuers than the chain has certificates.

#![no_main]

use libfuzzer_sys::fuzz_target;
use mqkv_broker::transport::PeerCertificate;

fuzz_target!(|data: &[u8]| {
    // Each certificate is a two-byte big-endian length and that many bytes.
    let mut chain = Vec::new();
    let mut rest = data;
    while let [hi, lo, tail @ ..] = rest {
        let n = usize::from(u16::from_be_bytes([*hi, *lo])).min(tail.len());
        let (der, after) = tail.split_at(n);
        chain.push(der);
        rest = after;
    }
    if let Some(id) = PeerCertificate::from_chain(&chain) {
        assert_eq!(Some(&id.der[..]), chain.first().copied());
        assert!(id.issuers.len() <= chain.len());
    }
});
