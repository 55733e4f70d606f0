//! PROXY protocol headers as a listener behind a proxy reads them: any bytes give the
//! addresses of one header (version 1 or 2) having read no further than its end, or a
//! refusal; never a panic, and never a wait for more than the header's own length.

#![no_main]

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use libfuzzer_sys::fuzz_target;
use mqkv_broker::transport::proxy::{parse, read_header};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    // Reading from memory never waits: the first poll finishes.
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(result) = pin!(read_header(&mut rest)).poll(&mut cx) else {
        panic!("reading a header from memory did not finish");
    };
    if result.is_ok() {
        let header = &data[..data.len() - rest.len()];
        assert!(header.len() <= 16 + 2048, "read past the longest header");
        // The header alone says the same.
        assert_eq!(parse(header).ok(), result.ok());
    }
    let _ = parse(data);
});
