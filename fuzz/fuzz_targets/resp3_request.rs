//! Request decoder: any bytes either parse or give one of the four request
//! errors, never a panic; the copying and zero-copy entry points agree; and
//! whatever parses survives an encode/parse round trip unchanged.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use mqkv_protocol::{parse_request, parse_request_bytes, ErrorKind};

fuzz_target!(|data: &[u8]| {
    let parsed = parse_request(data);
    assert_eq!(parse_request_bytes(&Bytes::copy_from_slice(data)), parsed);
    match parsed {
        Ok(command) => {
            let encoded = command.encode();
            assert_eq!(parse_request(&encoded), Ok(command));
        }
        Err(kind) => assert!(matches!(
            kind,
            ErrorKind::SyntaxError
                | ErrorKind::UnknownCommand
                | ErrorKind::WrongNumberOfArguments
                | ErrorKind::KeyLengthZero
        )),
    }
});
