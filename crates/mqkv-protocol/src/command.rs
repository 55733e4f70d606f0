//! Request payloads: parsing what clients publish, and encoding it the way
//! the SDKs do.
//!
//! Invariants:
//! - Any payload either parses into a [`Command`] or yields exactly one of
//!   the documented `-ERR` kinds; nothing panics, whatever the bytes.
//! - `parse_request(&cmd.encode()) == Ok(cmd)` for every command whose key
//!   (or pattern) is non-empty and whose PX, if any, is positive.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::hlc::parse_decimal;
use crate::resp::{bulk_len, put_array_header, put_bulk, put_bulk_header, Decimal, Reader};
use crate::ErrorKind;
use crate::Hlc;

/// SET condition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SetCondition {
    /// Set only if the key does not exist.
    Nx,
    /// Set only if the key does not exist or already holds the SET's own
    /// value. Takes no argument on the wire, whatever the article shows.
    Nex,
    /// Set only if the key exists and its version is this one (`IFVER v`, an extension:
    /// compare-and-set).
    IfVersion(Hlc),
}

/// Most keys one MGET may name.
pub const MAX_MGET_KEYS: usize = 128;

/// One state store request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Command {
    /// `SET key value [NX|NEX] [PX ms]`
    Set {
        key: Bytes,
        value: Bytes,
        condition: Option<SetCondition>,
        /// Time to live in milliseconds, always > 0.
        px_ms: Option<u64>,
    },
    /// `GET key`
    Get { key: Bytes },
    /// `DEL key`
    Del { key: Bytes },
    /// `VDEL key value`: delete only if the stored value equals `value`.
    VDel { key: Bytes, value: Bytes },
    /// `KEYNOTIFY key [STOP]`
    KeyNotify { key: Bytes, stop: bool },
    /// `SCAN pattern [token]`
    Scan {
        pattern: Bytes,
        token: Option<Bytes>,
    },
    /// `DEL key IFVER version` (an extension): delete only if the key's version is
    /// `version`.
    DelIfVersion { key: Bytes, version: Hlc },
    /// `MGET key...` (an extension): up to [`MAX_MGET_KEYS`] keys read at one moment.
    MGet { keys: Vec<Bytes> },
    /// `KEYNOTIFY pattern PATTERN [STOP]` (an extension): observe every key the glob
    /// `pattern` matches, existing or not yet.
    KeyNotifyPattern { pattern: Bytes, stop: bool },
    /// `KEYNOTIFY key SINCE version` (an extension): observe `key`, first receiving every
    /// change after `since` that happened meanwhile.
    KeyNotifySince { key: Bytes, since: Hlc },
    /// `KEYNOTIFY pattern PATTERN SINCE version` (an extension): a pattern watch that first
    /// receives every change after `since` of the keys it matches.
    KeyNotifyPatternSince { pattern: Bytes, since: Hlc },
}

impl Command {
    /// The verb as sent on the wire.
    pub fn verb(&self) -> &'static str {
        match self {
            Command::Set { .. } => "SET",
            Command::Get { .. } => "GET",
            Command::Del { .. } => "DEL",
            Command::VDel { .. } => "VDEL",
            Command::KeyNotify { .. } => "KEYNOTIFY",
            Command::Scan { .. } => "SCAN",
            Command::DelIfVersion { .. } => "DEL",
            Command::MGet { .. } => "MGET",
            Command::KeyNotifyPattern { .. }
            | Command::KeyNotifySince { .. }
            | Command::KeyNotifyPatternSince { .. } => "KEYNOTIFY",
        }
    }

    /// The key this command is about (the pattern for SCAN, the first key for MGET).
    pub fn key(&self) -> &Bytes {
        static NONE: Bytes = Bytes::new();
        match self {
            Command::Set { key, .. }
            | Command::Get { key }
            | Command::Del { key }
            | Command::VDel { key, .. }
            | Command::DelIfVersion { key, .. }
            | Command::KeyNotifySince { key, .. }
            | Command::KeyNotify { key, .. } => key,
            Command::Scan { pattern, .. }
            | Command::KeyNotifyPattern { pattern, .. }
            | Command::KeyNotifyPatternSince { pattern, .. } => pattern,
            Command::MGet { keys } => keys.first().unwrap_or(&NONE),
        }
    }

    /// True for the commands that change the keyspace and so go through the
    /// replicated log (SET, DEL, VDEL). These are also the ones `__ft`
    /// applies to.
    pub fn is_write(&self) -> bool {
        matches!(
            self,
            Command::Set { .. }
                | Command::Del { .. }
                | Command::VDel { .. }
                | Command::DelIfVersion { .. }
        )
    }

    /// Encodes the request exactly as the SDKs do: upper-case verb and
    /// options, condition before PX, PX in integer milliseconds.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(self.encoded_len_bound());
        self.encode_into(&mut out);
        out.freeze()
    }

    /// At least the length of [`Command::encode`]'s output.
    pub fn encoded_len_bound(&self) -> usize {
        let mut bound = 0;
        self.with_args(|args| bound = 16 + args.iter().map(|a| bulk_len(a)).sum::<usize>());
        bound
    }

    /// Appends what [`Command::encode`] returns to `out`, which must have
    /// room for [`Command::encoded_len_bound`] bytes if it cannot grow.
    pub fn encode_into<B: BufMut>(&self, out: &mut B) {
        // Straight into `out`: no piece goes through a buffer of its own first.
        self.with_args(|args| {
            put_array_header(out, args.len());
            for arg in args {
                put_bulk(out, arg);
            }
        });
    }

    /// Hands what [`Command::encode`] returns to `f` in consecutive pieces,
    /// without building it: key and value go as they are, not copied (for
    /// hashing a request with a large value).
    pub fn encode_pieces(&self, mut f: impl FnMut(&[u8])) {
        // `*`, `$` or nothing, a length of at most 20 digits, CRLF.
        fn put(f: &mut impl FnMut(&[u8]), write: impl FnOnce(&mut &mut [u8])) {
            let mut buf = [0u8; 24];
            let mut rest = &mut buf[..];
            write(&mut rest);
            let written = 24 - rest.len();
            f(&buf[..written]);
        }
        self.with_args(|args| {
            put(&mut f, |out| put_array_header(out, args.len()));
            for arg in args {
                put(&mut f, |out| put_bulk_header(out, arg.len()));
                f(arg);
                f(b"\r\n");
            }
        });
    }

    /// Calls `f` with the request's arguments, verb first.
    fn with_args(&self, f: impl FnOnce(&[&[u8]])) {
        // PX and versions are the only arguments not borrowed from `self`.
        let px = match self {
            Command::Set {
                px_ms: Some(ms), ..
            } => Some(Decimal::new(*ms)),
            _ => None,
        };
        let version = match self {
            Command::Set {
                condition: Some(SetCondition::IfVersion(v)),
                ..
            }
            | Command::DelIfVersion { version: v, .. }
            | Command::KeyNotifySince { since: v, .. }
            | Command::KeyNotifyPatternSince { since: v, .. } => Some(v.to_text()),
            _ => None,
        };
        let mut args = Args::default();
        match self {
            Command::Set {
                key,
                value,
                condition,
                ..
            } => {
                args.push(b"SET");
                args.push(key);
                args.push(value);
                match condition {
                    Some(SetCondition::Nx) => args.push(b"NX"),
                    Some(SetCondition::Nex) => args.push(b"NEX"),
                    Some(SetCondition::IfVersion(_)) => {
                        args.push(b"IFVER");
                        args.push(version.as_deref().unwrap_or_default().as_bytes());
                    }
                    None => {}
                }
                if let Some(px) = &px {
                    args.push(b"PX");
                    args.push(px.as_bytes());
                }
            }
            Command::Get { key } => {
                args.push(b"GET");
                args.push(key);
            }
            Command::Del { key } => {
                args.push(b"DEL");
                args.push(key);
            }
            Command::VDel { key, value } => {
                args.push(b"VDEL");
                args.push(key);
                args.push(value);
            }
            Command::KeyNotify { key, stop } => {
                args.push(b"KEYNOTIFY");
                args.push(key);
                if *stop {
                    args.push(b"STOP");
                }
            }
            Command::Scan { pattern, token } => {
                args.push(b"SCAN");
                args.push(pattern);
                if let Some(token) = token {
                    args.push(token);
                }
            }
            Command::DelIfVersion { key, .. } => {
                args.push(b"DEL");
                args.push(key);
                args.push(b"IFVER");
                args.push(version.as_deref().unwrap_or_default().as_bytes());
            }
            Command::MGet { keys } => {
                args.push(b"MGET");
                for key in keys {
                    args.push(key);
                }
            }
            Command::KeyNotifyPattern { pattern, stop } => {
                args.push(b"KEYNOTIFY");
                args.push(pattern);
                args.push(b"PATTERN");
                if *stop {
                    args.push(b"STOP");
                }
            }
            Command::KeyNotifySince { key, .. } => {
                args.push(b"KEYNOTIFY");
                args.push(key);
                args.push(b"SINCE");
                args.push(version.as_deref().unwrap_or_default().as_bytes());
            }
            Command::KeyNotifyPatternSince { pattern, .. } => {
                args.push(b"KEYNOTIFY");
                args.push(pattern);
                args.push(b"PATTERN");
                args.push(b"SINCE");
                args.push(version.as_deref().unwrap_or_default().as_bytes());
            }
        }
        f(args.as_slice());
    }
}

/// The arguments of one request: up to seven (`SET k v IFVER v PX ms`) kept on the stack,
/// more (an MGET's keys) in a vector.
#[derive(Default)]
struct Args<'a> {
    items: [&'a [u8]; 7],
    len: usize,
    more: Vec<&'a [u8]>,
}

impl<'a> Args<'a> {
    fn push(&mut self, arg: &'a [u8]) {
        if !self.more.is_empty() {
            self.more.push(arg);
        } else if let Some(slot) = self.items.get_mut(self.len) {
            *slot = arg;
            self.len += 1;
        } else {
            self.more.extend_from_slice(&self.items[..self.len]);
            self.more.push(arg);
        }
    }

    fn as_slice(&self) -> &[&'a [u8]] {
        if self.more.is_empty() {
            &self.items[..self.len]
        } else {
            &self.more
        }
    }
}

/// Parses a request payload, copying the keys and values out of it.
/// Prefer [`parse_request_bytes`] when the payload is already a [`Bytes`].
pub fn parse_request(payload: &[u8]) -> Result<Command, ErrorKind> {
    parse_request_bytes(&Bytes::copy_from_slice(payload))
}

/// Parses a request payload; keys and values are zero-copy slices of it.
///
/// Error precedence: framing (`syntax error`), then the verb
/// (`unknown command`), then the argument count (`wrong number of
/// arguments`), then an empty key or pattern (`the key length is zero`),
/// then options (`syntax error`).
pub fn parse_request_bytes(payload: &Bytes) -> Result<Command, ErrorKind> {
    let ranges = Reader::whole_bulk_array(payload).map_err(|_| ErrorKind::SyntaxError)?;
    let mut args = ranges.into_iter().map(|range| payload.slice(range));
    // `whole_bulk_array` refuses empty arrays, so the verb is present.
    let verb = args.next().ok_or(ErrorKind::SyntaxError)?;
    // The arguments are taken straight from the ranges, not gathered into a
    // vector of their own first.
    match Verb::parse(&verb)? {
        Verb::Set => parse_set(args),
        Verb::Get => one_key(args).map(|key| Command::Get { key }),
        Verb::Del => parse_del(args),
        Verb::MGet => parse_mget(args),
        Verb::VDel => parse_vdel(args),
        Verb::KeyNotify => parse_keynotify(args),
        Verb::Scan => parse_scan(args),
    }
}

enum Verb {
    Set,
    Get,
    Del,
    VDel,
    KeyNotify,
    Scan,
    MGet,
}

impl Verb {
    /// The SDKs send upper case; the article's examples are lower case.
    /// Accepting any case costs nothing and breaks no client.
    fn parse(verb: &[u8]) -> Result<Verb, ErrorKind> {
        const VERBS: [(&[u8], Verb); 7] = [
            (b"SET", Verb::Set),
            (b"GET", Verb::Get),
            (b"DEL", Verb::Del),
            (b"VDEL", Verb::VDel),
            (b"KEYNOTIFY", Verb::KeyNotify),
            (b"SCAN", Verb::Scan),
            (b"MGET", Verb::MGet),
        ];
        VERBS
            .into_iter()
            .find(|(name, _)| verb.eq_ignore_ascii_case(name))
            .map(|(_, verb)| verb)
            .ok_or(ErrorKind::UnknownCommand)
    }
}

fn non_empty(key: Bytes) -> Result<Bytes, ErrorKind> {
    if key.is_empty() {
        Err(ErrorKind::KeyLengthZero)
    } else {
        Ok(key)
    }
}

fn one_key(mut args: impl Iterator<Item = Bytes>) -> Result<Bytes, ErrorKind> {
    match (args.next(), args.next()) {
        (Some(key), None) => non_empty(key),
        _ => Err(ErrorKind::WrongNumberOfArguments),
    }
}

/// `DEL key`, or `DEL key IFVER version`.
fn parse_del(mut args: impl Iterator<Item = Bytes>) -> Result<Command, ErrorKind> {
    match (args.next(), args.next(), args.next(), args.next()) {
        (Some(key), None, None, None) => Ok(Command::Del {
            key: non_empty(key)?,
        }),
        // Anything else answers as before the extension: the wrong number of arguments.
        (Some(key), Some(option), Some(version), None) if option.eq_ignore_ascii_case(b"IFVER") => {
            Ok(Command::DelIfVersion {
                key: non_empty(key)?,
                version: parse_version(&version)?,
            })
        }
        _ => Err(ErrorKind::WrongNumberOfArguments),
    }
}

/// `MGET key...`: one to [`MAX_MGET_KEYS`] keys, none empty.
fn parse_mget(args: impl Iterator<Item = Bytes>) -> Result<Command, ErrorKind> {
    let mut keys = Vec::new();
    for key in args {
        if keys.len() == MAX_MGET_KEYS {
            return Err(ErrorKind::WrongNumberOfArguments);
        }
        keys.push(key);
    }
    if keys.is_empty() {
        return Err(ErrorKind::WrongNumberOfArguments);
    }
    if keys.iter().any(Bytes::is_empty) {
        return Err(ErrorKind::KeyLengthZero);
    }
    Ok(Command::MGet { keys })
}

/// A version as the server writes it in `__ts`.
fn parse_version(text: &[u8]) -> Result<Hlc, ErrorKind> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| Hlc::parse(t).ok())
        .ok_or(ErrorKind::SyntaxError)
}

fn parse_vdel(mut args: impl Iterator<Item = Bytes>) -> Result<Command, ErrorKind> {
    match (args.next(), args.next(), args.next()) {
        (Some(key), Some(value), None) => Ok(Command::VDel {
            key: non_empty(key)?,
            value,
        }),
        _ => Err(ErrorKind::WrongNumberOfArguments),
    }
}

/// `KEYNOTIFY key [STOP]`, or (extensions) `KEYNOTIFY pattern PATTERN [STOP]`,
/// `KEYNOTIFY key SINCE version` and `KEYNOTIFY pattern PATTERN SINCE version`.
fn parse_keynotify(args: impl Iterator<Item = Bytes>) -> Result<Command, ErrorKind> {
    // At most five: anything longer is the wrong number of arguments whatever it says.
    let args: Vec<Bytes> = args.take(5).collect();
    let is = |i: usize, word: &[u8]| args.get(i).is_some_and(|a| a.eq_ignore_ascii_case(word));
    match args.len() {
        3 if is(1, b"SINCE") => Ok(Command::KeyNotifySince {
            key: non_empty(args[0].clone())?,
            since: parse_version(&args[2])?,
        }),
        4 if is(1, b"PATTERN") && is(2, b"SINCE") => Ok(Command::KeyNotifyPatternSince {
            pattern: non_empty(args[0].clone())?,
            since: parse_version(&args[3])?,
        }),
        2 | 3 if is(1, b"PATTERN") => {
            let pattern = non_empty(args[0].clone())?;
            let stop = match args.get(2) {
                None => false,
                Some(last) if last.eq_ignore_ascii_case(b"STOP") => true,
                Some(_) => return Err(ErrorKind::SyntaxError),
            };
            Ok(Command::KeyNotifyPattern { pattern, stop })
        }
        1 | 2 => {
            let key = non_empty(args[0].clone())?;
            let stop = match args.get(1) {
                None => false,
                Some(option) if option.eq_ignore_ascii_case(b"STOP") => true,
                Some(_) => return Err(ErrorKind::SyntaxError),
            };
            Ok(Command::KeyNotify { key, stop })
        }
        _ => Err(ErrorKind::WrongNumberOfArguments),
    }
}

fn parse_scan(mut args: impl Iterator<Item = Bytes>) -> Result<Command, ErrorKind> {
    let (Some(pattern), token, None) = (args.next(), args.next(), args.next()) else {
        return Err(ErrorKind::WrongNumberOfArguments);
    };
    Ok(Command::Scan {
        pattern: non_empty(pattern)?,
        token,
    })
}

/// `SET key value` followed by options in any order (Redis accepts any
/// order, the SDKs send condition then PX). Each option at most once; NX
/// and NEX exclude each other.
fn parse_set(mut args: impl Iterator<Item = Bytes>) -> Result<Command, ErrorKind> {
    let (Some(key), Some(value)) = (args.next(), args.next()) else {
        return Err(ErrorKind::WrongNumberOfArguments);
    };
    let key = non_empty(key)?;
    let mut condition = None;
    let mut px_ms = None;
    while let Some(option) = args.next() {
        if option.eq_ignore_ascii_case(b"NX") || option.eq_ignore_ascii_case(b"NEX") {
            if condition.is_some() {
                return Err(ErrorKind::SyntaxError);
            }
            condition = Some(if option.len() == 2 {
                SetCondition::Nx
            } else {
                SetCondition::Nex
            });
        } else if option.eq_ignore_ascii_case(b"IFVER") {
            if condition.is_some() {
                return Err(ErrorKind::SyntaxError);
            }
            let version = args.next().ok_or(ErrorKind::SyntaxError)?;
            condition = Some(SetCondition::IfVersion(parse_version(&version)?));
        } else if option.eq_ignore_ascii_case(b"PX") {
            if px_ms.is_some() {
                return Err(ErrorKind::SyntaxError);
            }
            let ms = args.next().ok_or(ErrorKind::SyntaxError)?;
            px_ms = Some(parse_px(&ms).ok_or(ErrorKind::SyntaxError)?);
        } else {
            return Err(ErrorKind::SyntaxError);
        }
    }
    Ok(Command::Set {
        key,
        value,
        condition,
        px_ms,
    })
}

/// PX milliseconds: a positive integer, or a decimal with `.` or `,` as the
/// separator, truncated toward zero. .NET formats `TimeSpan.TotalMilliseconds`
/// (a double) with the current culture, so `1500.5` and `1500,5` do occur.
/// Zero after truncation, signs, exponents and empty parts are refused.
fn parse_px(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let integral = match text.split_once(['.', ',']) {
        Some((integral, fraction)) => {
            if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            integral
        }
        None => text,
    };
    parse_decimal(integral).filter(|&ms| ms > 0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::resp::put_bulk;
    use proptest::prelude::*;

    fn b(s: &'static [u8]) -> Bytes {
        Bytes::from_static(s)
    }

    /// Builds a request payload the way a client would.
    fn req(args: &[&[u8]]) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_array_header(&mut out, args.len());
        for arg in args {
            put_bulk(&mut out, arg);
        }
        out.to_vec()
    }

    fn set(key: &'static [u8], value: &'static [u8]) -> Command {
        Command::Set {
            key: b(key),
            value: b(value),
            condition: None,
            px_ms: None,
        }
    }

    #[test]
    fn wire_compat_sdk_examples() {
        assert_eq!(
            parse_request(b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n"),
            Ok(Command::Set {
                key: b(b"testkey"),
                value: b(b"testvalue"),
                condition: Some(SetCondition::Nx),
                px_ms: None,
            })
        );
        assert_eq!(
            parse_request(b"*2\r\n$3\r\nGET\r\n$5\r\nnokey\r\n"),
            Ok(Command::Get { key: b(b"nokey") })
        );
        assert_eq!(
            parse_request(b"*3\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n$4\r\nSTOP\r\n"),
            Ok(Command::KeyNotify {
                key: b(b"k"),
                stop: true
            })
        );
        assert_eq!(
            parse_request(b"*2\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n"),
            Ok(Command::Scan {
                pattern: b(b"key*"),
                token: None
            })
        );
    }

    #[test]
    fn article_lower_case_examples() {
        assert_eq!(
            parse_request(b"*3\r\n$3\r\nset\r\n$7\r\nSETKEY2\r\n$6\r\nVALUE5\r\n"),
            Ok(set(b"SETKEY2", b"VALUE5"))
        );
        assert_eq!(
            parse_request(b"*2\r\n$3\r\nget\r\n$7\r\nSETKEY2\r\n"),
            Ok(Command::Get { key: b(b"SETKEY2") })
        );
        assert_eq!(
            parse_request(b"*2\r\n$3\r\ndel\r\n$7\r\nSETKEY2\r\n"),
            Ok(Command::Del { key: b(b"SETKEY2") })
        );
        assert_eq!(
            parse_request(b"*3\r\n$4\r\nvdel\r\n$7\r\nSETKEY2\r\n$3\r\nABC\r\n"),
            Ok(Command::VDel {
                key: b(b"SETKEY2"),
                value: b(b"ABC")
            })
        );
        assert_eq!(
            parse_request(&req(&[b"KeyNotify", b"k", b"sToP"])),
            Ok(Command::KeyNotify {
                key: b(b"k"),
                stop: true
            })
        );
    }

    #[test]
    fn keys_and_values_are_binary_safe() {
        let key: &[u8] = b"\x00\r\n\xff";
        let value: &[u8] = b"\r\n$3\r\n*";
        assert_eq!(
            parse_request(&req(&[b"SET", key, value])),
            Ok(Command::Set {
                key: Bytes::from_static(key),
                value: Bytes::from_static(value),
                condition: None,
                px_ms: None,
            })
        );
    }

    #[test]
    fn empty_value_and_large_key_are_legal() {
        assert_eq!(
            parse_request(&req(&[b"SET", b"k", b""])),
            Ok(set(b"k", b""))
        );
        let key = vec![0u8; 6_500];
        let value = vec![7u8; 65_000];
        let cmd = parse_request(&req(&[b"SET", &key, &value])).unwrap();
        assert_eq!(cmd.key().len(), 6_500);
    }

    #[test]
    fn parse_bytes_is_zero_copy() {
        let payload = Bytes::from(req(&[b"GET", b"the-key"]));
        let Command::Get { key } = parse_request_bytes(&payload).unwrap() else {
            panic!("not a GET");
        };
        let range = payload.as_ptr_range();
        assert!(
            range.contains(&key.as_ptr()),
            "key must point into the payload"
        );
    }

    #[test]
    fn unknown_and_malformed() {
        assert_eq!(
            parse_request(&req(&[b"MSET", b"k"])),
            Err(ErrorKind::UnknownCommand)
        );
        assert_eq!(parse_request(&req(&[b""])), Err(ErrorKind::UnknownCommand));
        assert_eq!(
            parse_request(&req(&[b"GETX", b"k"])),
            Err(ErrorKind::UnknownCommand)
        );
        assert_eq!(parse_request(b"*0\r\n"), Err(ErrorKind::SyntaxError));
        assert_eq!(parse_request(b""), Err(ErrorKind::SyntaxError));
        assert_eq!(parse_request(b"GET k\r\n"), Err(ErrorKind::SyntaxError));
        assert_eq!(parse_request(b"+OK\r\n"), Err(ErrorKind::SyntaxError));
        assert_eq!(
            parse_request(b"*2\r\n$3\r\nGET\r\n$5\r\nk\r\n"),
            Err(ErrorKind::SyntaxError)
        );
        assert_eq!(
            parse_request(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\r\n"),
            Err(ErrorKind::SyntaxError)
        );
        assert_eq!(
            parse_request(b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
            Err(ErrorKind::SyntaxError)
        );
        assert_eq!(
            parse_request(b"*999999999999\r\n$3\r\nGET\r\n"),
            Err(ErrorKind::SyntaxError)
        );
    }

    #[test]
    fn wrong_number_of_arguments() {
        use ErrorKind::WrongNumberOfArguments as W;
        let cases: &[&[&[u8]]] = &[
            &[b"GET"],
            &[b"GET", b"a", b"b"],
            &[b"DEL"],
            &[b"DEL", b"a", b"b"],
            &[b"SET"],
            &[b"SET", b"k"],
            &[b"VDEL"],
            &[b"VDEL", b"k"],
            &[b"VDEL", b"k", b"v", b"x"],
            &[b"KEYNOTIFY"],
            &[b"KEYNOTIFY", b"k", b"STOP", b"x"],
            &[b"SCAN"],
            &[b"SCAN", b"*", b"t", b"x"],
        ];
        for args in cases {
            assert_eq!(parse_request(&req(args)), Err(W), "{args:?}");
        }
    }

    #[test]
    fn empty_key_is_key_length_zero() {
        use ErrorKind::KeyLengthZero as Z;
        assert_eq!(parse_request(b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n"), Err(Z));
        assert_eq!(parse_request(&req(&[b"SET", b"", b"v"])), Err(Z));
        assert_eq!(parse_request(&req(&[b"DEL", b""])), Err(Z));
        assert_eq!(parse_request(&req(&[b"VDEL", b"", b"v"])), Err(Z));
        assert_eq!(parse_request(&req(&[b"KEYNOTIFY", b""])), Err(Z));
        assert_eq!(parse_request(&req(&[b"SCAN", b""])), Err(Z));
        // The argument count is checked first.
        assert_eq!(
            parse_request(&req(&[b"GET", b"", b""])),
            Err(ErrorKind::WrongNumberOfArguments)
        );
        // An empty key beats a bad option.
        assert_eq!(parse_request(&req(&[b"SET", b"", b"v", b"XX"])), Err(Z));
    }

    #[test]
    fn keynotify_option_must_be_stop() {
        assert_eq!(
            parse_request(&req(&[b"KEYNOTIFY", b"k", b"STAP"])),
            Err(ErrorKind::SyntaxError)
        );
        assert_eq!(
            parse_request(&req(&[b"KEYNOTIFY", b"k"])),
            Ok(Command::KeyNotify {
                key: b(b"k"),
                stop: false
            })
        );
    }

    #[test]
    fn scan_token_is_opaque_binary() {
        assert_eq!(
            parse_request(&req(&[b"SCAN", b"*", b"\x00\xffx"])),
            Ok(Command::Scan {
                pattern: b(b"*"),
                token: Some(b(b"\x00\xffx"))
            })
        );
    }

    #[test]
    fn set_options_in_any_order_and_case() {
        let expect = |condition, px_ms| Command::Set {
            key: b(b"k"),
            value: b(b"v"),
            condition,
            px_ms,
        };
        let cases: &[(&[&[u8]], Command)] = &[
            (
                &[b"SET", b"k", b"v", b"NEX"],
                expect(Some(SetCondition::Nex), None),
            ),
            (
                &[b"SET", b"k", b"v", b"nx"],
                expect(Some(SetCondition::Nx), None),
            ),
            (&[b"SET", b"k", b"v", b"PX", b"10"], expect(None, Some(10))),
            (
                &[b"SET", b"k", b"v", b"NEX", b"PX", b"2000"],
                expect(Some(SetCondition::Nex), Some(2000)),
            ),
            (
                &[b"SET", b"k", b"v", b"px", b"2000", b"Nex"],
                expect(Some(SetCondition::Nex), Some(2000)),
            ),
            (
                &[b"SET", b"k", b"v", b"PX", b"1500.5", b"NX"],
                expect(Some(SetCondition::Nx), Some(1500)),
            ),
            (
                &[b"SET", b"k", b"v", b"PX", b"1500,999"],
                expect(None, Some(1500)),
            ),
            (&[b"SET", b"k", b"v", b"PX", b"0007"], expect(None, Some(7))),
            (&[b"SET", b"k", b"v", b"PX", b"1.0"], expect(None, Some(1))),
        ];
        for (args, want) in cases {
            assert_eq!(parse_request(&req(args)).as_ref(), Ok(want), "{args:?}");
        }
    }

    #[test]
    fn set_option_errors() {
        let cases: &[&[&[u8]]] = &[
            &[b"SET", b"k", b"v", b"NX", b"NEX"],
            &[b"SET", b"k", b"v", b"NEX", b"NX"],
            &[b"SET", b"k", b"v", b"NX", b"NX"],
            &[b"SET", b"k", b"v", b"PX", b"1", b"PX", b"2"],
            &[b"SET", b"k", b"v", b"PX"],
            &[b"SET", b"k", b"v", b"NX", b"PX"],
            &[b"SET", b"k", b"v", b"PX", b"0"],
            &[b"SET", b"k", b"v", b"PX", b"0.9"],
            &[b"SET", b"k", b"v", b"PX", b"-5"],
            &[b"SET", b"k", b"v", b"PX", b"+5"],
            &[b"SET", b"k", b"v", b"PX", b"abc"],
            &[b"SET", b"k", b"v", b"PX", b""],
            &[b"SET", b"k", b"v", b"PX", b"1e3"],
            &[b"SET", b"k", b"v", b"PX", b"1."],
            &[b"SET", b"k", b"v", b"PX", b".5"],
            &[b"SET", b"k", b"v", b"PX", b"1.5.5"],
            &[b"SET", b"k", b"v", b"PX", b"1,5,5"],
            &[b"SET", b"k", b"v", b"PX", b" 5"],
            &[b"SET", b"k", b"v", b"PX", b"99999999999999999999999"],
            &[b"SET", b"k", b"v", b"PX", b"\xff"],
            &[b"SET", b"k", b"v", b"EX", b"5"],
            &[b"SET", b"k", b"v", b"XX"],
            &[b"SET", b"k", b"v", b"NEX", b"v"],
            &[b"SET", b"k", b"v", b"GET"],
        ];
        for args in cases {
            assert_eq!(
                parse_request(&req(args)),
                Err(ErrorKind::SyntaxError),
                "{args:?}"
            );
        }
    }

    #[test]
    fn encode_matches_sdk_bytes() {
        let cmd = Command::Set {
            key: b(b"testkey"),
            value: b(b"testvalue"),
            condition: Some(SetCondition::Nx),
            px_ms: None,
        };
        assert_eq!(
            &cmd.encode()[..],
            b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n"
        );
        let cmd = Command::Set {
            key: b(b"lock"),
            value: b(b"me"),
            condition: Some(SetCondition::Nex),
            px_ms: Some(10_000),
        };
        assert_eq!(
            &cmd.encode()[..],
            b"*6\r\n$3\r\nSET\r\n$4\r\nlock\r\n$2\r\nme\r\n$3\r\nNEX\r\n$2\r\nPX\r\n$5\r\n10000\r\n"
        );
        let cmd = Command::Set {
            key: b(b"k"),
            value: b(b""),
            condition: None,
            px_ms: Some(5),
        };
        assert_eq!(
            &cmd.encode()[..],
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$2\r\nPX\r\n$1\r\n5\r\n"
        );
        assert_eq!(
            &Command::Get { key: b(b"k") }.encode()[..],
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
        );
        assert_eq!(
            &Command::Del { key: b(b"k") }.encode()[..],
            b"*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n"
        );
        assert_eq!(
            &Command::VDel {
                key: b(b"k"),
                value: b(b"v")
            }
            .encode()[..],
            b"*3\r\n$4\r\nVDEL\r\n$1\r\nk\r\n$1\r\nv\r\n"
        );
        assert_eq!(
            &Command::KeyNotify {
                key: b(b"k"),
                stop: false
            }
            .encode()[..],
            b"*2\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n"
        );
        assert_eq!(
            &Command::KeyNotify {
                key: b(b"k"),
                stop: true
            }
            .encode()[..],
            b"*3\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n$4\r\nSTOP\r\n"
        );
        assert_eq!(
            &Command::Scan {
                pattern: b(b"k*"),
                token: Some(b(b"\x00\xff"))
            }
            .encode()[..],
            b"*3\r\n$4\r\nSCAN\r\n$2\r\nk*\r\n$2\r\n\x00\xff\r\n"
        );
    }

    #[test]
    fn verbs_and_write_flag() {
        assert!(set(b"k", b"v").is_write());
        assert!(Command::Del { key: b(b"k") }.is_write());
        assert!(!Command::Get { key: b(b"k") }.is_write());
        assert!(!Command::KeyNotify {
            key: b(b"k"),
            stop: false
        }
        .is_write());
        assert_eq!(set(b"k", b"v").verb(), "SET");
        assert_eq!(
            Command::Scan {
                pattern: b(b"p"),
                token: None
            }
            .key(),
            &b(b"p")
        );
    }

    fn arb_bytes(min: usize) -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), min..24).prop_map(Bytes::from)
    }

    pub(crate) fn arb_version() -> impl Strategy<Value = Hlc> {
        (
            0u64..1_000_000_000_000_000,
            0u64..=99_999,
            "[a-z0-9-]{1,12}",
        )
            .prop_map(|(ms, counter, node)| Hlc::new(ms, counter, node.as_str()))
    }

    pub(crate) fn arb_command() -> impl Strategy<Value = Command> {
        let condition = proptest::option::of(prop_oneof![
            Just(SetCondition::Nx),
            Just(SetCondition::Nex),
            arb_version().prop_map(SetCondition::IfVersion),
        ]);
        prop_oneof![
            (
                arb_bytes(1),
                arb_bytes(0),
                condition,
                proptest::option::of(1u64..=u64::MAX)
            )
                .prop_map(|(key, value, condition, px_ms)| Command::Set {
                    key,
                    value,
                    condition,
                    px_ms
                }),
            arb_bytes(1).prop_map(|key| Command::Get { key }),
            arb_bytes(1).prop_map(|key| Command::Del { key }),
            (arb_bytes(1), arb_bytes(0)).prop_map(|(key, value)| Command::VDel { key, value }),
            (arb_bytes(1), any::<bool>()).prop_map(|(key, stop)| Command::KeyNotify { key, stop }),
            (arb_bytes(1), proptest::option::of(arb_bytes(0)))
                .prop_map(|(pattern, token)| Command::Scan { pattern, token }),
            (arb_bytes(1), arb_version())
                .prop_map(|(key, version)| Command::DelIfVersion { key, version }),
            proptest::collection::vec(arb_bytes(1), 1..12).prop_map(|keys| Command::MGet { keys }),
            (arb_bytes(1), any::<bool>())
                .prop_map(|(pattern, stop)| Command::KeyNotifyPattern { pattern, stop }),
            (arb_bytes(1), arb_version())
                .prop_map(|(key, since)| Command::KeyNotifySince { key, since }),
            (arb_bytes(1), arb_version())
                .prop_map(|(pattern, since)| Command::KeyNotifyPatternSince { pattern, since }),
        ]
    }

    /// The examples of docs/extensions.md, byte for byte.
    #[test]
    fn extension_examples_of_the_documentation() {
        let v = Hlc::parse("001732270000123:00000:mqkv").expect("version");
        let set = Command::Set {
            key: b(b"config"),
            value: b(b"v2"),
            condition: Some(SetCondition::IfVersion(v.clone())),
            px_ms: None,
        };
        assert_eq!(
            &set.encode()[..],
            b"*5\r\n$3\r\nSET\r\n$6\r\nconfig\r\n$2\r\nv2\r\n$5\r\nIFVER\r\n$26\r\n001732270000123:00000:mqkv\r\n"
        );
        let del = Command::DelIfVersion {
            key: b(b"config"),
            version: Hlc::parse("001732270000456:00000:mqkv").expect("version"),
        };
        assert_eq!(
            &del.encode()[..],
            b"*4\r\n$3\r\nDEL\r\n$6\r\nconfig\r\n$5\r\nIFVER\r\n$26\r\n001732270000456:00000:mqkv\r\n"
        );
        let watch = Command::KeyNotifyPattern {
            pattern: b(b"sensors/*"),
            stop: false,
        };
        assert_eq!(
            &watch.encode()[..],
            b"*3\r\n$9\r\nKEYNOTIFY\r\n$9\r\nsensors/*\r\n$7\r\nPATTERN\r\n"
        );
        let resume = Command::KeyNotifySince {
            key: b(b"door"),
            since: Hlc::parse("001732270000123:00000:mqkv").expect("version"),
        };
        assert_eq!(
            &resume.encode()[..],
            b"*4\r\n$9\r\nKEYNOTIFY\r\n$4\r\ndoor\r\n$5\r\nSINCE\r\n$26\r\n001732270000123:00000:mqkv\r\n"
        );
        let mget = Command::MGet {
            keys: vec![b(b"a"), b(b"b"), b(b"c")],
        };
        assert_eq!(
            &mget.encode()[..],
            b"*4\r\n$4\r\nMGET\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"
        );
        let answer = crate::Response::Values(vec![
            Some((b(b"1"), v)),
            None,
            Some((
                b(b"three"),
                Hlc::parse("001732270000124:00000:mqkv").expect("version"),
            )),
        ]);
        assert_eq!(
            &answer.encode()[..],
            &b"*3\r\n*2\r\n$1\r\n1\r\n$26\r\n001732270000123:00000:mqkv\r\n$-1\r\n*2\r\n$5\r\nthree\r\n$26\r\n001732270000124:00000:mqkv\r\n"[..]
        );
    }

    #[test]
    fn extension_requests_parse() {
        let v = "001700000000000:00002:node-1";
        assert_eq!(
            parse_request(&req(&[
                b"SET",
                b"k",
                b"v",
                b"IFVER",
                v.as_bytes(),
                b"PX",
                b"10"
            ])),
            Ok(Command::Set {
                key: b(b"k"),
                value: b(b"v"),
                condition: Some(SetCondition::IfVersion(Hlc::new(
                    1_700_000_000_000,
                    2,
                    "node-1"
                ))),
                px_ms: Some(10),
            })
        );
        assert_eq!(
            parse_request(&req(&[b"del", b"k", b"ifver", v.as_bytes()])),
            Ok(Command::DelIfVersion {
                key: b(b"k"),
                version: Hlc::new(1_700_000_000_000, 2, "node-1"),
            })
        );
        assert_eq!(
            parse_request(&req(&[b"MGET", b"a", b"b"])),
            Ok(Command::MGet {
                keys: vec![b(b"a"), b(b"b")]
            })
        );
        // Errors as the store already answers them.
        let e = |args: &[&[u8]]| parse_request(&req(args)).err();
        assert_eq!(
            e(&[b"SET", b"k", b"v", b"IFVER", b"nonsense"]),
            Some(ErrorKind::SyntaxError)
        );
        assert_eq!(
            e(&[b"SET", b"k", b"v", b"IFVER"]),
            Some(ErrorKind::SyntaxError)
        );
        assert_eq!(
            e(&[b"SET", b"k", b"v", b"NX", b"IFVER", v.as_bytes()]),
            Some(ErrorKind::SyntaxError)
        );
        assert_eq!(
            e(&[b"DEL", b"k", b"IFVER", b"nonsense"]),
            Some(ErrorKind::SyntaxError)
        );
        // Other DEL forms answer as they always did.
        assert_eq!(
            e(&[b"DEL", b"k", b"IFVER"]),
            Some(ErrorKind::WrongNumberOfArguments)
        );
        assert_eq!(
            e(&[b"DEL", b"k", b"NOPE", v.as_bytes()]),
            Some(ErrorKind::WrongNumberOfArguments)
        );
        assert_eq!(
            e(&[b"DEL", b"k", b"IFVER", v.as_bytes(), b"x"]),
            Some(ErrorKind::WrongNumberOfArguments)
        );
        assert_eq!(e(&[b"MGET"]), Some(ErrorKind::WrongNumberOfArguments));
        assert_eq!(
            parse_request(&req(&[b"KEYNOTIFY", b"sensors/*", b"pattern"])),
            Ok(Command::KeyNotifyPattern {
                pattern: b(b"sensors/*"),
                stop: false
            })
        );
        assert_eq!(
            parse_request(&req(&[b"KEYNOTIFY", b"sensors/*", b"PATTERN", b"STOP"])),
            Ok(Command::KeyNotifyPattern {
                pattern: b(b"sensors/*"),
                stop: true
            })
        );
        assert_eq!(
            e(&[b"KEYNOTIFY", b"s*", b"PATTERN", b"NOW"]),
            Some(ErrorKind::SyntaxError)
        );
        assert_eq!(
            e(&[b"KEYNOTIFY", b"", b"PATTERN"]),
            Some(ErrorKind::KeyLengthZero)
        );
        assert_eq!(
            parse_request(&req(&[b"KEYNOTIFY", b"k", b"since", v.as_bytes()])),
            Ok(Command::KeyNotifySince {
                key: b(b"k"),
                since: Hlc::new(1_700_000_000_000, 2, "node-1"),
            })
        );
        assert_eq!(
            e(&[b"KEYNOTIFY", b"k", b"SINCE", b"then"]),
            Some(ErrorKind::SyntaxError)
        );
        assert_eq!(
            parse_request(&req(&[
                b"KEYNOTIFY",
                b"s/*",
                b"PATTERN",
                b"SINCE",
                v.as_bytes()
            ])),
            Ok(Command::KeyNotifyPatternSince {
                pattern: b(b"s/*"),
                since: Hlc::new(1_700_000_000_000, 2, "node-1"),
            })
        );
        // AIO's forms answer as they always did.
        assert_eq!(
            e(&[b"KEYNOTIFY", b"k", b"STOP", b"x"]),
            Some(ErrorKind::WrongNumberOfArguments)
        );
        assert_eq!(
            e(&[b"KEYNOTIFY", b"k", b"PATTERN", b"STOP", b"x"]),
            Some(ErrorKind::WrongNumberOfArguments)
        );
        assert_eq!(e(&[b"MGET", b"a", b""]), Some(ErrorKind::KeyLengthZero));
        let many: Vec<Vec<u8>> = (0..=MAX_MGET_KEYS)
            .map(|i| format!("k{i}").into_bytes())
            .collect();
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(many.iter().map(Vec::as_slice));
        assert_eq!(e(&args), Some(ErrorKind::WrongNumberOfArguments));
        assert!(parse_request(&req(&args[..args.len() - 1])).is_ok());
    }

    proptest! {
        #[test]
        fn encode_parse_round_trip(cmd in arb_command()) {
            prop_assert_eq!(parse_request(&cmd.encode()), Ok(cmd));
        }

        /// A buffer that cannot grow, sized by the bound, takes the whole
        /// encoding (writing past it would panic).
        #[test]
        fn encode_into_a_slice_of_the_bound(cmd in arb_command()) {
            let bound = cmd.encoded_len_bound();
            let mut buf = vec![0u8; bound];
            let mut rest = &mut buf[..];
            cmd.encode_into(&mut rest);
            let written = bound - rest.len();
            prop_assert_eq!(&buf[..written], &cmd.encode()[..]);
        }

        /// The pieces a request is hashed from are its encoding, in order.
        #[test]
        fn pieces_are_the_encoding(cmd in arb_command()) {
            let mut joined = Vec::new();
            cmd.encode_pieces(|piece| joined.extend_from_slice(piece));
            prop_assert_eq!(&joined[..], &cmd.encode()[..]);
        }

        #[test]
        fn arbitrary_bytes_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(cmd) = parse_request(&payload) {
                prop_assert_eq!(parse_request(&cmd.encode()), Ok(cmd));
            }
        }

        #[test]
        fn truncated_requests_are_syntax_errors(cmd in arb_command(), cut in any::<prop::sample::Index>()) {
            let bytes = cmd.encode();
            let cut = cut.index(bytes.len());
            prop_assert_eq!(parse_request(&bytes[..cut]), Err(ErrorKind::SyntaxError));
        }
    }
}
