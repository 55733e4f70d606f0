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
pub(crate) mod tests;
