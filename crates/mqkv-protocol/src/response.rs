//! Response payloads: the exact bytes the server sends (wire-compat 3.1 and
//! 6.1) and a client-side parser for them.
//!
//! Invariants:
//! - [`Response::encode`] never produces an empty payload (Go panics on one)
//!   and writes "not applied" as `:-1\r\n`, never the article's `-1\r\n`.
//! - [`Response::parse`] accepts every payload `encode` produces, and
//!   `parse(encode(parse(p)))` equals `parse(p)` for any accepted `p`.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::resp::{bulk_len, put_array_header, put_bulk, Reader};
use crate::ErrorKind;

/// A payload that is not a state store response or notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed state store payload")]
pub struct DecodeError;

/// One state store answer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Response {
    /// `+OK\r\n`: SET applied, KEYNOTIFY accepted.
    Ok,
    /// `:-1\r\n`: SET condition failed, or VDEL value mismatch.
    NotApplied,
    /// `$<len>\r\n<bytes>\r\n`: GET hit.
    Value(Bytes),
    /// `$-1\r\n`: GET miss.
    Nil,
    /// `:<n>\r\n`: DEL/VDEL count, KEYNOTIFY STOP on an unobserved key (`:0`).
    /// `Integer(-1)` has the same bytes as [`Response::NotApplied`] and is
    /// parsed back as that.
    Integer(i64),
    /// `-ERR <message>\r\n` with one of the known messages.
    Error(ErrorKind),
    /// `-ERR <text>\r\n` with a text this version does not know; clients
    /// must tolerate new ones.
    ErrorText(String),
    /// A SCAN page: `*1\r\n*<k>\r\n<keys>` for the last page, or
    /// `*2\r\n*<k>\r\n<keys>$<len>\r\n<token>\r\n` when more follow.
    ScanPage {
        keys: Vec<Bytes>,
        token: Option<Bytes>,
    },
    /// An MGET answer (an extension): `*<n>\r\n`, then per key `*2\r\n` with its value and
    /// version as blob strings, or `$-1\r\n` for a key that does not exist. Parse it with
    /// [`Response::parse_values`]: as bytes it can look like a SCAN page.
    Values(Vec<Option<(Bytes, crate::Hlc)>>),
}

impl From<ErrorKind> for Response {
    fn from(kind: ErrorKind) -> Self {
        Response::Error(kind)
    }
}

/// The bytes of [`Response::Value`] for `value`, encoded from a borrowed
/// value (a GET answers from the stored record without copying it first).
pub fn encode_value(value: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(bulk_len(value));
    put_bulk(&mut out, value);
    out.freeze()
}

impl Response {
    /// The exact payload bytes.
    pub fn encode(&self) -> Bytes {
        match self {
            Response::Ok => Bytes::from_static(b"+OK\r\n"),
            Response::NotApplied => Bytes::from_static(b":-1\r\n"),
            Response::Nil => Bytes::from_static(b"$-1\r\n"),
            Response::Integer(n) => Bytes::from(format!(":{n}\r\n")),
            Response::Value(value) => encode_value(value),
            Response::Error(kind) => Bytes::from(format!("-ERR {}\r\n", kind.message())),
            Response::ErrorText(text) => {
                // A CR or LF inside would end the line early and make the
                // rest of the text look like trailing garbage to every SDK.
                let text = text.replace(['\r', '\n'], " ");
                Bytes::from(format!("-ERR {text}\r\n"))
            }
            Response::ScanPage { keys, token } => {
                let size = 24
                    + keys.iter().map(|k| bulk_len(k)).sum::<usize>()
                    + token.as_ref().map_or(0, |t| bulk_len(t));
                let mut out = BytesMut::with_capacity(size);
                put_array_header(&mut out, if token.is_some() { 2 } else { 1 });
                put_array_header(&mut out, keys.len());
                for key in keys {
                    put_bulk(&mut out, key);
                }
                if let Some(token) = token {
                    put_bulk(&mut out, token);
                }
                out.freeze()
            }
            Response::Values(values) => {
                let versions: Vec<Option<(&Bytes, String)>> = values
                    .iter()
                    .map(|v| {
                        v.as_ref()
                            .map(|(value, version)| (value, version.to_text()))
                    })
                    .collect();
                let size = 16
                    + versions
                        .iter()
                        .map(|v| {
                            v.as_ref().map_or(5, |(value, version)| {
                                4 + bulk_len(value) + bulk_len(version.as_bytes())
                            })
                        })
                        .sum::<usize>();
                let mut out = BytesMut::with_capacity(size);
                put_array_header(&mut out, versions.len());
                for v in &versions {
                    match v {
                        Some((value, version)) => {
                            put_array_header(&mut out, 2);
                            put_bulk(&mut out, value);
                            put_bulk(&mut out, version.as_bytes());
                        }
                        None => out.put_slice(b"$-1\r\n"),
                    }
                }
                out.freeze()
            }
        }
    }

    /// Parses the answer to an MGET: [`Response::Values`], or an error as
    /// [`Response::parse`] reads it.
    pub fn parse_values(payload: &[u8]) -> Result<Response, DecodeError> {
        if !payload.starts_with(b"*") {
            return Response::parse(payload);
        }
        let mut reader = Reader::new(payload);
        // The smallest element is a nil, `$-1\r\n`.
        let n = reader.array_header_of(5).map_err(|_| DecodeError)?;
        let mut values = Vec::with_capacity(n);
        for _ in 0..n {
            if reader.eat(b"$-1\r\n") {
                values.push(None);
                continue;
            }
            if reader.array_header().map_err(|_| DecodeError)? != 2 {
                return Err(DecodeError);
            }
            let value = reader.bulk().map_err(|_| DecodeError)?;
            let version = reader.bulk().map_err(|_| DecodeError)?;
            let version = std::str::from_utf8(&payload[version])
                .ok()
                .and_then(|t| crate::Hlc::parse(t).ok())
                .ok_or(DecodeError)?;
            values.push(Some((Bytes::copy_from_slice(&payload[value]), version)));
        }
        if reader.is_empty() {
            Ok(Response::Values(values))
        } else {
            Err(DecodeError)
        }
    }

    /// Parses a server's payload. The whole payload must be one item with no
    /// trailing bytes.
    pub fn parse(payload: &[u8]) -> Result<Response, DecodeError> {
        let mut reader = Reader::new(payload);
        let response = if reader.eat(b"+OK\r\n") {
            Response::Ok
        } else if reader.eat(b"$-1\r\n") {
            Response::Nil
        } else if reader.eat(b"-ERR ") {
            let rest = &payload[5..];
            let text = rest.strip_suffix(b"\r\n").ok_or(DecodeError)?;
            if text.contains(&b'\r') || text.contains(&b'\n') {
                return Err(DecodeError);
            }
            // Servers send ASCII; anything else is kept readable rather
            // than refused, because an unknown error is still an error.
            let text = String::from_utf8_lossy(text);
            return Ok(match ErrorKind::from_message(&text) {
                Some(kind) => Response::Error(kind),
                None => Response::ErrorText(text.into_owned()),
            });
        } else if reader.eat(b":") {
            match reader.signed_line().map_err(|_| DecodeError)? {
                -1 => Response::NotApplied,
                n => Response::Integer(n),
            }
        } else if payload.starts_with(b"$") {
            let range = reader.bulk().map_err(|_| DecodeError)?;
            Response::Value(Bytes::copy_from_slice(&payload[range]))
        } else if payload.starts_with(b"*") {
            parse_scan_page(&mut reader, payload)?
        } else {
            return Err(DecodeError);
        };
        if reader.is_empty() {
            Ok(response)
        } else {
            Err(DecodeError)
        }
    }
}

fn parse_scan_page(reader: &mut Reader<'_>, payload: &[u8]) -> Result<Response, DecodeError> {
    // The smallest element of the outer array is an empty inner array.
    const MIN_EMPTY_ARRAY_LEN: usize = b"*0\r\n".len();
    let outer = reader
        .array_header_of(MIN_EMPTY_ARRAY_LEN)
        .map_err(|_| DecodeError)?;
    if !(1..=2).contains(&outer) {
        return Err(DecodeError);
    }
    let count = reader.array_header().map_err(|_| DecodeError)?;
    let keys = reader
        .bulk_elements(count)
        .map_err(|_| DecodeError)?
        .into_iter()
        .map(|range| Bytes::copy_from_slice(&payload[range]))
        .collect();
    let token = if outer == 2 {
        let range = reader.bulk().map_err(|_| DecodeError)?;
        Some(Bytes::copy_from_slice(&payload[range]))
    } else {
        None
    };
    Ok(Response::ScanPage { keys, token })
}

/// A change notification payload (wire-compat 4.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Notification {
    /// The key now holds `value`.
    Set { value: Bytes },
    /// The key was deleted by DEL, VDEL or expiry. Always `DELETE` on the
    /// wire: every SDK refuses the article's `DEL`.
    Delete,
}

const NOTIFY_SET_PREFIX: &[u8] = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n";
const NOTIFY_DELETE: &[u8] = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n";

impl Notification {
    /// The exact payload bytes. The Rust SDK matches these byte for byte.
    pub fn encode(&self) -> Bytes {
        match self {
            Notification::Set { value } => {
                let mut out = BytesMut::with_capacity(NOTIFY_SET_PREFIX.len() + bulk_len(value));
                out.put_slice(NOTIFY_SET_PREFIX);
                put_bulk(&mut out, value);
                out.freeze()
            }
            Notification::Delete => Bytes::from_static(NOTIFY_DELETE),
        }
    }

    /// Parses a notification payload, accepting only the two exact forms.
    pub fn parse(payload: &[u8]) -> Result<Notification, DecodeError> {
        if payload == NOTIFY_DELETE {
            return Ok(Notification::Delete);
        }
        let rest = payload.strip_prefix(NOTIFY_SET_PREFIX).ok_or(DecodeError)?;
        let mut reader = Reader::new(rest);
        let range = reader.bulk().map_err(|_| DecodeError)?;
        if !reader.is_empty() {
            return Err(DecodeError);
        }
        Ok(Notification::Set {
            value: Bytes::copy_from_slice(&rest[range]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn b(s: &'static [u8]) -> Bytes {
        Bytes::from_static(s)
    }

    #[test]
    fn canonical_bytes() {
        let cases: Vec<(Response, &[u8])> = vec![
            (Response::Ok, b"+OK\r\n"),
            (Response::NotApplied, b":-1\r\n"),
            (Response::Nil, b"$-1\r\n"),
            (Response::Integer(0), b":0\r\n"),
            (Response::Integer(1), b":1\r\n"),
            (Response::Value(b(b"1234")), b"$4\r\n1234\r\n"),
            (Response::Value(b(b"")), b"$0\r\n\r\n"),
            (Response::Value(b(b"a\r\nb")), b"$4\r\na\r\nb\r\n"),
            (Response::Error(ErrorKind::SyntaxError), b"-ERR syntax error\r\n"),
            (
                Response::Error(ErrorKind::FencingTokenLowerVersion),
                b"-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n",
            ),
            (Response::ErrorText("brand new".into()), b"-ERR brand new\r\n"),
            (
                Response::ScanPage {
                    keys: vec![b(b"key1"), b(b"key2")],
                    token: Some(b(b"off:20")),
                },
                b"*2\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n$6\r\noff:20\r\n",
            ),
            (
                Response::ScanPage {
                    keys: vec![b(b"a")],
                    token: None,
                },
                b"*1\r\n*1\r\n$1\r\na\r\n",
            ),
            (
                Response::ScanPage {
                    keys: vec![],
                    token: Some(b(b"\x00\xffx")),
                },
                b"*2\r\n*0\r\n$3\r\n\x00\xffx\r\n",
            ),
            (
                Response::ScanPage {
                    keys: vec![],
                    token: None,
                },
                b"*1\r\n*0\r\n",
            ),
        ];
        for (response, bytes) in cases {
            assert_eq!(&response.encode()[..], bytes, "{response:?}");
            assert_eq!(Response::parse(bytes), Ok(response));
        }
    }

    #[test]
    fn every_error_kind_round_trips() {
        for kind in ErrorKind::ALL {
            let bytes = Response::from(kind).encode();
            assert!(bytes.starts_with(b"-ERR ") && bytes.ends_with(b"\r\n"));
            assert_eq!(Response::parse(&bytes), Ok(Response::Error(kind)));
        }
    }

    #[test]
    fn minus_one_integer_reads_as_not_applied() {
        assert_eq!(&Response::Integer(-1).encode()[..], b":-1\r\n");
        assert_eq!(Response::parse(b":-1\r\n"), Ok(Response::NotApplied));
        assert_eq!(Response::parse(b":-7\r\n"), Ok(Response::Integer(-7)));
    }

    #[test]
    fn error_text_line_breaks_are_neutralised() {
        let bytes = Response::ErrorText("a\r\nb".into()).encode();
        assert_eq!(&bytes[..], b"-ERR a  b\r\n");
        assert_eq!(
            Response::parse(&bytes),
            Ok(Response::ErrorText("a  b".into()))
        );
    }

    #[test]
    fn refuses_malformed() {
        let bad: &[&[u8]] = &[
            b"",
            b"-1\r\n",
            b"+OK",
            b"+OK\r\nx",
            b"+OKAY\r\n",
            b"-ERR: syntax error\r\n",
            b"-ERR syntax error",
            b"-ERR a\rb\r\n",
            b":\r\n",
            b":1",
            b":1\r\n:1\r\n",
            b":99999999999999999999\r\n",
            b"$3\r\nab\r\n",
            b"$2\r\nabc\r\n",
            b"$-2\r\n",
            b"*0\r\n",
            b"*3\r\n*0\r\n$1\r\na\r\n$1\r\nb\r\n",
            b"*1\r\n*-1\r\n",
            b"*1\r\n*1\r\n$-1\r\n",
            b"*2\r\n*0\r\n",
            b"*1\r\n*0\r\nx",
            b"*1\r\n$1\r\na\r\n",
            b"_\r\n",
        ];
        for payload in bad {
            assert_eq!(
                Response::parse(payload),
                Err(DecodeError),
                "{:?}",
                String::from_utf8_lossy(payload)
            );
        }
    }

    #[test]
    fn notification_bytes() {
        let set = Notification::Set { value: b(b"abc") };
        assert_eq!(
            &set.encode()[..],
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"
        );
        assert_eq!(
            &Notification::Delete.encode()[..],
            b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"
        );
        assert_eq!(Notification::parse(&set.encode()), Ok(set));
        assert_eq!(
            Notification::parse(&Notification::Delete.encode()),
            Ok(Notification::Delete)
        );
        let empty = Notification::Set { value: b(b"") };
        assert_eq!(Notification::parse(&empty.encode()), Ok(empty));
    }

    #[test]
    fn notification_refuses_other_forms() {
        let bad: &[&[u8]] = &[
            b"*2\r\n$6\r\nNOTIFY\r\n$3\r\nDEL\r\n",
            b"*2\r\n$6\r\nNOTIFY\r\n$7\r\nEXPIRED\r\n",
            b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\nx",
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nab\r\n",
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$1\r\na\r\n$1\r\nb\r\n",
            b"*3\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n",
            b"",
        ];
        for payload in bad {
            assert_eq!(Notification::parse(payload), Err(DecodeError));
        }
    }

    fn arb_bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(Bytes::from)
    }

    fn arb_response() -> impl Strategy<Value = Response> {
        prop_oneof![
            Just(Response::Ok),
            Just(Response::NotApplied),
            Just(Response::Nil),
            any::<i64>()
                .prop_filter("-1 is NotApplied", |n| *n != -1)
                .prop_map(Response::Integer),
            arb_bytes().prop_map(Response::Value),
            proptest::sample::select(ErrorKind::ALL.to_vec()).prop_map(Response::Error),
            "[a-z ]{0,20}"
                .prop_filter("known texts parse as Error", |t| ErrorKind::from_message(t)
                    .is_none())
                .prop_map(Response::ErrorText),
            (
                proptest::collection::vec(arb_bytes(), 0..5),
                proptest::option::of(arb_bytes())
            )
                .prop_map(|(keys, token)| Response::ScanPage { keys, token }),
        ]
    }

    proptest! {
        #[test]
        fn response_round_trip(response in arb_response()) {
            let bytes = response.encode();
            prop_assert!(!bytes.is_empty());
            prop_assert_eq!(Response::parse(&bytes), Ok(response));
        }

        #[test]
        fn response_parse_is_stable(payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(parsed) = Response::parse(&payload) {
                prop_assert_eq!(Response::parse(&parsed.encode()), Ok(parsed));
            }
        }

        #[test]
        fn values_round_trip(values in proptest::collection::vec(
            proptest::option::of((arb_bytes(), crate::command::tests::arb_version())), 0..6)) {
            let response = Response::Values(values);
            prop_assert_eq!(Response::parse_values(&response.encode()), Ok(response));
        }

        #[test]
        fn values_parse_is_stable(payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(parsed) = Response::parse_values(&payload) {
                prop_assert_eq!(Response::parse_values(&parsed.encode()), Ok(parsed));
            }
        }

        #[test]
        fn notification_round_trip(value in arb_bytes(), delete in any::<bool>()) {
            let n = if delete { Notification::Delete } else { Notification::Set { value } };
            prop_assert_eq!(Notification::parse(&n.encode()), Ok(n));
        }
    }
}
