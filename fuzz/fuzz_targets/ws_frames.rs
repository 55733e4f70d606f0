//! WebSocket frames as the broker reads them from a client, with the broker's framing settings
//! and its handling of each message: any bytes give binary payloads no longer than the size
//! limit and together no longer than what arrived, or a refusal, or the end of the stream;
//! never a panic.

#![no_main]

use std::io::{Cursor, Read, Write};

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mqkv_broker::transport::ws::{config, take};
use tungstenite::protocol::{Role, WebSocket};

/// The client's side of the connection: what it sent, and a sink for the broker's answers.
struct Client(Cursor<Vec<u8>>);

impl Read for Client {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Client {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&limit, frames)) = data.split_first() else {
        return;
    };
    // Size limits from 16 bytes to 4 KiB, so that refusals of long messages are reached.
    let max_message = 16 + usize::from(limit) * 16;
    let client = Client(Cursor::new(frames.to_vec()));
    let mut ws = WebSocket::from_raw_socket(client, Role::Server, Some(config(max_message)));
    let mut buf = BytesMut::new();
    let mut taken = 0;
    while let Ok(message) = ws.read() {
        match take(message, &mut buf) {
            Ok(Some(0)) | Err(_) => break,
            Ok(Some(n)) => {
                assert!(
                    n <= max_message,
                    "{n}-byte message over the {max_message}-byte limit"
                );
                taken += n;
            }
            Ok(None) => {}
        }
    }
    assert_eq!(buf.len(), taken);
    assert!(taken <= frames.len());
});
