//! Hybrid logical clock timestamps (`<wallClockMs>:<counter>:<nodeId>`) and
//! the server clock that hands out key versions.
//!
//! Invariants:
//! - [`Hlc`] is totally ordered by `(wall_ms, counter, node_id bytes)`, the
//!   order Go `Compare` and .NET `CompareTo` use for fencing tokens.
//! - [`HlcClock::next_version`] never returns a value lower than or equal to
//!   one it returned before, and always returns a value strictly greater than
//!   the request timestamp it is given.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::resp::Decimal;
use crate::ErrorKind;

/// Allowed distance, in milliseconds, between a client timestamp and the
/// server clock before the request is refused (the SDKs use the same 60 s).
pub const MAX_CLOCK_SKEW_MS: u64 = 60_000;

/// The largest counter the server emits. .NET parses the counter as an
/// `int32`, so a larger one would make every .NET client reject the version.
pub const MAX_COUNTER: u64 = i32::MAX as u64;

/// One HLC timestamp.
///
/// The derived ordering compares fields in declaration order, and `str`
/// compares by bytes, which is exactly the protocol's total order. The node
/// id is shared: every version a clock issues points at the clock's own
/// copy, so a stored version costs no allocation of its own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Hlc {
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
    /// Logical counter within one millisecond.
    pub counter: u64,
    /// Identity of the clock that produced the timestamp; never contains `:`.
    pub node_id: Arc<str>,
}

/// Why a string is not an HLC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HlcError {
    /// Not exactly three `:`-separated parts.
    #[error("an HLC has exactly three ':'-separated parts")]
    WrongPartCount,
    /// The wall clock part is empty, signed, non-decimal or above `u64::MAX`.
    #[error("the HLC wall clock is not an unsigned decimal integer")]
    BadWallClock,
    /// The counter part is empty, signed, non-decimal or above `u64::MAX`.
    #[error("the HLC counter is not an unsigned decimal integer")]
    BadCounter,
}

impl From<HlcError> for ErrorKind {
    fn from(_: HlcError) -> Self {
        ErrorKind::MalformedTimestamp
    }
}

impl Hlc {
    /// Builds a timestamp.
    pub fn new(wall_ms: u64, counter: u64, node_id: impl Into<Arc<str>>) -> Self {
        Hlc {
            wall_ms,
            counter,
            node_id: node_id.into(),
        }
    }

    /// Parses the wire form.
    ///
    /// Accepted: any number of leading zeros (no padding is required), ms
    /// and counter up to `u64::MAX`, and any node id without `:` —
    /// **including the empty one**. The Rust SDK accepts an empty node id;
    /// refusing it (as .NET does) would only turn a usable fencing token
    /// into `malformed timestamp` with nothing gained, since ordering and
    /// equality stay well defined.
    ///
    /// Refused: a part count other than three, an empty ms or counter, a
    /// sign (`+`/`-`, which Go's `ParseInt` would allow for ms), any other
    /// non-digit (so no decimals or whitespace), and overflow.
    pub fn parse(text: &str) -> Result<Hlc, HlcError> {
        match Hlc::parse_plain(text) {
            Some(hlc) => Ok(hlc),
            None => Hlc::parse_general(text),
        }
    }

    /// The common, well-formed text in one pass: each number's digits read
    /// up to its colon (at most 19 of them, so no overflow), then a node id
    /// without a colon. `None` for anything else, which the general parse
    /// then judges (and names the error of).
    fn parse_plain(text: &str) -> Option<Hlc> {
        /// Reads digits up to a colon: the number and what follows the colon.
        fn number(bytes: &[u8]) -> Option<(u64, &[u8])> {
            let mut value = 0u64;
            let mut len = 0;
            for &b in bytes.iter().take(19) {
                let digit = b.wrapping_sub(b'0');
                if digit > 9 {
                    break;
                }
                value = value * 10 + u64::from(digit);
                len += 1;
            }
            match bytes.get(len) {
                Some(b':') if len > 0 => Some((value, &bytes[len + 1..])),
                _ => None,
            }
        }
        let (wall_ms, rest) = number(text.as_bytes())?;
        let (counter, node) = number(rest)?;
        if memchr::memchr(b':', node).is_some() {
            return None;
        }
        // The node id is the text's end, after two ASCII colons: on a
        // character boundary.
        let node_id = text.get(text.len() - node.len()..)?;
        Some(Hlc {
            wall_ms,
            counter,
            node_id: node_id.into(),
        })
    }

    fn parse_general(text: &str) -> Result<Hlc, HlcError> {
        let mut colons = memchr::memchr_iter(b':', text.as_bytes());
        let (Some(first), Some(second), None) = (colons.next(), colons.next(), colons.next())
        else {
            return Err(HlcError::WrongPartCount);
        };
        // Cut at ASCII bytes, so on character boundaries.
        let part = |from: usize, to: usize| text.get(from..to).ok_or(HlcError::WrongPartCount);
        let (ms, counter, node_id) = (
            part(0, first)?,
            part(first + 1, second)?,
            part(second + 1, text.len())?,
        );
        Ok(Hlc {
            wall_ms: parse_decimal(ms).ok_or(HlcError::BadWallClock)?,
            counter: parse_decimal(counter).ok_or(HlcError::BadCounter)?,
            node_id: node_id.into(),
        })
    }

    /// Reads an optional `__ts`/`__ft` user property: absent is `Ok(None)`,
    /// present but unparsable is `malformed timestamp`.
    pub fn from_property(value: Option<&str>) -> Result<Option<Hlc>, ErrorKind> {
        value
            .map(Hlc::parse)
            .transpose()
            .map_err(|_| ErrorKind::MalformedTimestamp)
    }
}

/// Unsigned decimal with only ASCII digits; `None` on anything else.
/// `u64::from_str` is not used because it accepts a leading `+`.
pub(crate) fn parse_decimal(text: &str) -> Option<u64> {
    /// Every number of this many digits fits in a `u64`.
    const NEVER_OVERFLOWS: usize = 19;
    if text.is_empty() {
        return None;
    }
    if text.len() <= NEVER_OVERFLOWS {
        // The common case (an HLC's 15 and 5 digits) without a check per digit for overflow.
        return text.bytes().try_fold(0u64, |acc, b| {
            let digit = b.wrapping_sub(b'0');
            (digit <= 9).then(|| acc * 10 + u64::from(digit))
        });
    }
    text.bytes().try_fold(0u64, |acc, b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

impl FromStr for Hlc {
    type Err = HlcError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Hlc::parse(s)
    }
}

impl Hlc {
    /// The `__ts` text, as [`Display`](fmt::Display) writes it, in one
    /// allocation of the exact size (every response and notification
    /// carries one).
    pub fn to_text(&self) -> String {
        let counter = Decimal::new(self.counter);
        WALL_TEXT.with_borrow_mut(|(wall_ms, wall)| {
            // Versions issued within one millisecond share their first part:
            // formatted once per millisecond and thread, copied after that.
            if *wall_ms != Some(self.wall_ms) {
                wall.clear();
                push_padded(wall, Decimal::new(self.wall_ms).as_bytes(), 15);
                *wall_ms = Some(self.wall_ms);
            }
            let len = wall.len() + 1 + counter.as_bytes().len().max(5) + 1 + self.node_id.len();
            let mut text = String::with_capacity(len);
            text.push_str(wall);
            text.push(':');
            push_padded(&mut text, counter.as_bytes(), 5);
            text.push(':');
            text.push_str(&self.node_id);
            text
        })
    }
}

thread_local! {
    /// The wall clock part of the last [`Hlc::to_text`] on this thread, and
    /// the milliseconds it spells.
    static WALL_TEXT: std::cell::RefCell<(Option<u64>, String)> =
        const { std::cell::RefCell::new((None, String::new())) };
}

/// Appends ASCII `digits`, zero-padded to at least `width`.
fn push_padded(text: &mut String, digits: &[u8], width: usize) {
    const ZEROS: &str = "000000000000000";
    let mut pad = width.saturating_sub(digits.len());
    while pad > 0 {
        let n = pad.min(ZEROS.len());
        text.push_str(&ZEROS[..n]);
        pad -= n;
    }
    text.extend(digits.iter().map(|&d| char::from(d)));
}

impl fmt::Display for Hlc {
    /// `%015d:%05d:%s`, the layout all three SDKs emit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// The server's clock `(L, C)` plus its node id. Pure: the caller supplies
/// the wall clock, so replaying the same inputs gives the same versions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HlcClock {
    wall_ms: u64,
    counter: u64,
    node_id: Arc<str>,
}

impl HlcClock {
    /// A clock that has not issued anything yet. `node_id` must not contain
    /// `:`; every `:` is replaced by `-` so the versions always parse.
    pub fn new(node_id: impl Into<String>) -> Self {
        let node_id: String = node_id.into();
        HlcClock {
            wall_ms: 0,
            counter: 0,
            node_id: node_id.replace(':', "-").into(),
        }
    }

    /// The node id stamped on every version.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The last issued value (or the initial `0:0` state).
    pub fn current(&self) -> Hlc {
        Hlc::new(self.wall_ms, self.counter, self.node_id.clone())
    }

    /// Issues the version for one write (wire-compat 5.4):
    ///
    /// ```text
    /// t = max(now, L, R.ts + 1 if R present and R.ts >= max(now, L) else 0)
    /// if t == L { C += 1 } else { L = t; C = 0 }
    /// ```
    ///
    /// Bumping the wall clock past the request instead of the counter keeps
    /// counters at 0 for sequential writes, which the Rust lease tests
    /// assert. The request's own counter is deliberately ignored: the result
    /// is already strictly greater because its wall clock is.
    ///
    /// One addition: once `C` reaches [`MAX_COUNTER`] the clock moves `L` on
    /// by a millisecond instead, because .NET cannot parse larger counters.
    /// Reaching it needs two billion writes inside one millisecond of `L`,
    /// so ordinary operation never sees it.
    pub fn next_version(&mut self, now_ms: u64, request_ts: Option<&Hlc>) -> Hlc {
        let base = now_ms.max(self.wall_ms);
        let past_request = match request_ts {
            Some(ts) if ts.wall_ms >= base => ts.wall_ms.saturating_add(1),
            _ => 0,
        };
        let t = base.max(past_request);
        if t == self.wall_ms {
            if self.counter >= MAX_COUNTER {
                self.wall_ms = self.wall_ms.saturating_add(1);
                self.counter = 0;
            } else {
                self.counter += 1;
            }
        } else {
            self.wall_ms = t;
            self.counter = 0;
        }
        self.current()
    }

    /// Issues the version of a write to a key whose last version is `previous`, as
    /// [`Self::next_version`] does but against that key's version instead of the whole
    /// store's: the new version is above the request's `__ts` and above `previous`, with a
    /// counter above 0 only when `previous` was issued in the same millisecond. Writes to other
    /// keys in that millisecond leave it alone, so a lease renewed every few seconds keeps
    /// counter 0 however busy the store is. The clock still moves up to it, so a key created
    /// anew (no `previous`: [`Self::next_version`]) gets a version above every one issued.
    pub fn next_version_after(
        &mut self,
        now_ms: u64,
        request_ts: Option<&Hlc>,
        previous: Option<&Hlc>,
    ) -> Hlc {
        let Some(previous) = previous else {
            return self.next_version(now_ms, request_ts);
        };
        let base = now_ms.max(previous.wall_ms);
        let past_request = match request_ts {
            Some(ts) if ts.wall_ms >= base => ts.wall_ms.saturating_add(1),
            _ => 0,
        };
        let t = base.max(past_request);
        let (wall_ms, counter) = if t != previous.wall_ms {
            (t, 0)
        } else if previous.counter >= MAX_COUNTER {
            (t.saturating_add(1), 0)
        } else {
            (t, previous.counter + 1)
        };
        if (wall_ms, counter) > (self.wall_ms, self.counter) {
            self.wall_ms = wall_ms;
            self.counter = counter;
        }
        Hlc::new(wall_ms, counter, self.node_id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_keys_version_counts_only_its_own_writes_in_a_millisecond() {
        let mut clock = HlcClock::new("n");
        let first = clock.next_version(1_000, None);
        assert_eq!((first.wall_ms, first.counter), (1_000, 0));
        // Other keys written in the same millisecond move the store's clock on...
        for _ in 0..5 {
            clock.next_version(2_000, None);
        }
        assert_eq!(clock.current().counter, 4);
        // ...but not this key's counter.
        let renewed = clock.next_version_after(2_000, None, Some(&first));
        assert_eq!((renewed.wall_ms, renewed.counter), (2_000, 0));
        // A second write to it in its own millisecond does count.
        let again = clock.next_version_after(2_000, None, Some(&renewed));
        assert_eq!((again.wall_ms, again.counter), (2_000, 1));
        // Always above the request's timestamp and the key's last version.
        let ahead = Hlc::new(5_000, 9, "client");
        let v = clock.next_version_after(2_000, Some(&ahead), Some(&again));
        assert!(v > ahead && v > again, "{v}");
        assert_eq!(v.counter, 0);
        // A key created anew is above everything issued.
        let fresh = clock.next_version(2_000, None);
        assert!(fresh > v && fresh > again);
    }

    proptest! {
        /// Whatever the order of writes to one key and to others, each of the key's versions
        /// is above its previous one and above its request's timestamp.
        #[test]
        fn per_key_versions_increase(writes in proptest::collection::vec((0u64..50, any::<bool>(), proptest::option::of(0u64..60)), 1..200)) {
            let mut clock = HlcClock::new("n");
            let mut last: Option<Hlc> = None;
            let mut now = 1_000;
            for (step, this_key, ts) in writes {
                now += step % 3;
                let ts = ts.map(|t| Hlc::new(now + t - 30, 3, "c"));
                if this_key {
                    let v = clock.next_version_after(now, ts.as_ref(), last.as_ref());
                    if let Some(prev) = &last {
                        prop_assert!(v > *prev);
                    }
                    if let Some(ts) = &ts {
                        prop_assert!(v > *ts);
                    }
                    last = Some(v);
                } else {
                    clock.next_version(now, ts.as_ref());
                }
                if let Some(l) = &last {
                    prop_assert!(clock.current() >= *l);
                }
            }
        }
    }

    #[test]
    fn display_pads_ms_and_counter() {
        assert_eq!(
            Hlc::new(1_795_318_897_606, 0, "StateStoreProto").to_string(),
            "001795318897606:00000:StateStoreProto"
        );
        assert_eq!(Hlc::new(0, 7, "n").to_string(), "000000000000000:00007:n");
        // Wider values are not truncated.
        assert_eq!(
            Hlc::new(u64::MAX, 123_456, "n").to_string(),
            "18446744073709551615:123456:n"
        );
    }

    #[test]
    fn padding_wider_than_the_zeros_at_hand() {
        for (digits, width) in [
            (&b"7"[..], 20),
            (b"7", 31),
            (b"123", 3),
            (b"123", 2),
            (b"", 16),
        ] {
            let mut text = String::new();
            push_padded(&mut text, digits, width);
            let digits = std::str::from_utf8(digits).unwrap_or_default();
            assert_eq!(text, format!("{digits:0>width$}"));
        }
    }

    #[test]
    fn text_of_versions_sharing_and_changing_milliseconds() {
        // The wall clock text is kept between calls on a thread: a run of versions within one
        // millisecond, then others, then back, each spelled out in full.
        let walls = [
            1_795_318_897_606,
            1_795_318_897_606,
            1_795_318_897_607,
            0,
            1_795_318_897_606,
        ];
        for (i, wall) in walls.into_iter().chain([u64::MAX, 9, 9]).enumerate() {
            for (counter, node) in [(0, "a"), (1, "node-b"), (99_999, "a"), (123_456, "")] {
                let hlc = Hlc::new(wall, counter + i as u64, node);
                let layout = format!("{:015}:{:05}:{}", wall, counter + i as u64, node);
                assert_eq!(hlc.to_text(), layout);
                assert_eq!(hlc.to_text().len(), layout.len());
            }
        }
    }

    #[test]
    fn parse_accepts_sdk_forms() {
        assert_eq!(
            Hlc::parse("001795318897604:00000:4e023795-a056-4567-8aa6-05df9cbf105d").unwrap(),
            Hlc::new(1_795_318_897_604, 0, "4e023795-a056-4567-8aa6-05df9cbf105d")
        );
        // The article's unpadded example.
        assert_eq!(
            Hlc::parse("1696374425000:1:StateStore").unwrap(),
            Hlc::new(1_696_374_425_000, 1, "StateStore")
        );
        // .NET's deliberately low fencing token is well formed.
        assert_eq!(
            Hlc::parse("000000000000000:00000:b0d2c4e1").unwrap(),
            Hlc::new(0, 0, "b0d2c4e1")
        );
        assert_eq!(
            Hlc::parse("0000000000000000000000000042:0000000000001:x").unwrap(),
            Hlc::new(42, 1, "x")
        );
        assert_eq!(
            Hlc::parse("18446744073709551615:18446744073709551615:n").unwrap(),
            Hlc::new(u64::MAX, u64::MAX, "n")
        );
    }

    #[test]
    fn parse_accepts_empty_node_id() {
        assert_eq!(Hlc::parse("5:6:").unwrap(), Hlc::new(5, 6, ""));
    }

    #[test]
    fn parse_rejects_malformed() {
        use HlcError::*;
        let cases: &[(&str, HlcError)] = &[
            ("", WrongPartCount),
            ("1:2", WrongPartCount),
            ("1:2:n:x", WrongPartCount),
            ("1:2:n:", WrongPartCount),
            (":2:n", BadWallClock),
            ("1::n", BadCounter),
            ("-1:2:n", BadWallClock),
            ("+1:2:n", BadWallClock),
            ("1:+2:n", BadCounter),
            ("1:-2:n", BadCounter),
            ("1.5:2:n", BadWallClock),
            (" 1:2:n", BadWallClock),
            ("1 :2:n", BadWallClock),
            ("0x1:2:n", BadWallClock),
            ("18446744073709551616:0:n", BadWallClock),
            ("1:18446744073709551616:n", BadCounter),
            ("١:2:n", BadWallClock),
        ];
        for (text, err) in cases {
            assert_eq!(Hlc::parse(text), Err(*err), "{text:?}");
            assert_eq!(text.parse::<Hlc>(), Err(*err), "{text:?}");
        }
    }

    #[test]
    fn from_property_maps_errors_to_malformed_timestamp() {
        assert_eq!(Hlc::from_property(None), Ok(None));
        assert_eq!(
            Hlc::from_property(Some("1:2:n")),
            Ok(Some(Hlc::new(1, 2, "n")))
        );
        assert_eq!(
            Hlc::from_property(Some("garbage")),
            Err(ErrorKind::MalformedTimestamp)
        );
        assert_eq!(
            ErrorKind::from(HlcError::BadCounter),
            ErrorKind::MalformedTimestamp
        );
    }

    #[test]
    fn order_is_ms_then_counter_then_node_bytes() {
        let mut v = vec![
            Hlc::new(2, 0, "a"),
            Hlc::new(1, 5, "z"),
            Hlc::new(1, 5, "B"),
            Hlc::new(1, 6, ""),
            Hlc::new(0, 99, "zz"),
        ];
        v.sort();
        assert_eq!(
            v,
            vec![
                Hlc::new(0, 99, "zz"),
                Hlc::new(1, 5, "B"),
                Hlc::new(1, 5, "z"),
                Hlc::new(1, 6, ""),
                Hlc::new(2, 0, "a"),
            ]
        );
        assert!(Hlc::new(1, 5, "a") != Hlc::new(1, 5, "b"));
    }

    #[test]
    fn clock_sequential_writes_keep_counter_zero() {
        let mut clock = HlcClock::new("srv");
        let a = clock.next_version(1_000, Some(&Hlc::new(999, 0, "c")));
        let b = clock.next_version(3_000, Some(&Hlc::new(2_999, 4, "c")));
        assert_eq!(a, Hlc::new(1_000, 0, "srv"));
        assert_eq!(b, Hlc::new(3_000, 0, "srv"));
    }

    #[test]
    fn clock_bumps_past_request_from_the_same_millisecond() {
        let mut clock = HlcClock::new("srv");
        // Client stamped the same millisecond the server handles it in.
        let v = clock.next_version(1_000, Some(&Hlc::new(1_000, 3, "c")));
        assert_eq!(v, Hlc::new(1_001, 0, "srv"));
        assert!(v > Hlc::new(1_000, 3, "c"));
    }

    #[test]
    fn clock_follows_a_client_ahead_of_it() {
        let mut clock = HlcClock::new("srv");
        let v = clock.next_version(1_000, Some(&Hlc::new(5_000, 0, "c")));
        assert_eq!(v, Hlc::new(5_001, 0, "srv"));
        // The server wall clock is now behind L: counters advance.
        assert_eq!(clock.next_version(1_001, None), Hlc::new(5_001, 1, "srv"));
        assert_eq!(clock.next_version(1_002, None), Hlc::new(5_001, 2, "srv"));
        // An old request timestamp does not move it.
        assert_eq!(
            clock.next_version(1_003, Some(&Hlc::new(10, 0, "c"))),
            Hlc::new(5_001, 3, "srv")
        );
        // Real time catches up and the counter resets.
        assert_eq!(clock.next_version(6_000, None), Hlc::new(6_000, 0, "srv"));
    }

    #[test]
    fn clock_same_millisecond_increments_counter() {
        let mut clock = HlcClock::new("srv");
        assert_eq!(clock.next_version(7, None), Hlc::new(7, 0, "srv"));
        assert_eq!(clock.next_version(7, None), Hlc::new(7, 1, "srv"));
        // Wall clock going backwards does not move versions backwards.
        assert_eq!(clock.next_version(3, None), Hlc::new(7, 2, "srv"));
    }

    #[test]
    fn clock_never_emits_counter_above_int32() {
        let mut clock = HlcClock {
            wall_ms: 50,
            counter: MAX_COUNTER - 1,
            node_id: "srv".into(),
        };
        assert_eq!(
            clock.next_version(10, None),
            Hlc::new(50, MAX_COUNTER, "srv")
        );
        assert_eq!(clock.next_version(10, None), Hlc::new(51, 0, "srv"));
    }

    #[test]
    fn clock_saturates_instead_of_overflowing() {
        let mut clock = HlcClock::new("srv");
        let v = clock.next_version(5, Some(&Hlc::new(u64::MAX, 0, "c")));
        assert_eq!(v.wall_ms, u64::MAX);
        let w = clock.next_version(5, None);
        assert!(w > v);
    }

    #[test]
    fn clock_node_id_never_contains_colon() {
        let mut clock = HlcClock::new("a:b");
        assert_eq!(clock.node_id(), "a-b");
        let v = clock.next_version(1, None);
        assert_eq!(Hlc::parse(&v.to_string()).unwrap(), v);
    }

    fn arb_hlc() -> impl Strategy<Value = Hlc> {
        (any::<u64>(), any::<u64>(), "[^:]{0,12}").prop_map(|(ms, c, n)| Hlc::new(ms, c, n))
    }

    proptest! {
        #[test]
        fn display_parse_round_trip(hlc in arb_hlc()) {
            prop_assert_eq!(Hlc::parse(&hlc.to_string()).unwrap(), hlc);
        }

        #[test]
        fn text_is_the_sdk_layout(hlc in arb_hlc()) {
            let layout = format!("{:015}:{:05}:{}", hlc.wall_ms, hlc.counter, hlc.node_id);
            prop_assert_eq!(hlc.to_text(), layout);
        }

        #[test]
        fn order_matches_tuple_order(a in arb_hlc(), b in arb_hlc()) {
            let ta = (a.wall_ms, a.counter, a.node_id.as_bytes());
            let tb = (b.wall_ms, b.counter, b.node_id.as_bytes());
            prop_assert_eq!(a.cmp(&b), ta.cmp(&tb));
        }

        /// What `u64::from_str` reads from digits alone, at every length around where a
        /// `u64` may overflow; anything but digits is refused.
        #[test]
        fn decimals_are_read_as_the_standard_library_reads_them(
            digits in "[0-9]{1,24}",
            n in any::<u64>(),
            junk in "[^0-9]",
            at in any::<prop::sample::Index>(),
        ) {
            prop_assert_eq!(parse_decimal(&digits), digits.parse::<u64>().ok());
            prop_assert_eq!(parse_decimal(&n.to_string()), Some(n));
            let mut bad = digits.clone();
            bad.insert_str(at.index(digits.len() + 1), &junk);
            prop_assert_eq!(parse_decimal(&bad), None);
        }

        #[test]
        fn parse_never_panics(text in ".{0,40}") {
            let _ = Hlc::parse(&text);
        }

        /// The one-pass parse of well-formed texts gives what the general parse gives, for
        /// texts near the layout: numbers of 0 to 24 digits (so around where a `u64`
        /// overflows), signs, spaces and other junk in them, missing and extra colons, node
        /// ids empty, non-ASCII or holding a colon.
        #[test]
        fn parse_agrees_with_the_general_parse(
            wall in "[0-9]{0,24}|[0-9]{0,5}[+ a-f:é][0-9]{0,5}",
            counter in "[0-9]{0,24}|[0-9]{0,3}[+ x:][0-9]{0,3}",
            node in "[^:]{0,12}|[a-z]{0,4}:[a-z]{0,4}|",
            parts in 1usize..5,
        ) {
            let text = [wall.as_str(), counter.as_str(), node.as_str(), "extra"][..parts].join(":");
            prop_assert_eq!(Hlc::parse(&text), Hlc::parse_general(&text));
        }

        #[test]
        fn versions_increase_and_exceed_requests(
            steps in proptest::collection::vec(
                (0u64..10_000, proptest::option::of((0u64..12_000, 0u64..5))),
                1..60,
            )
        ) {
            let mut clock = HlcClock::new("srv");
            let mut last: Option<Hlc> = None;
            for (now, ts) in steps {
                let request = ts.map(|(ms, c)| Hlc::new(ms, c, "client"));
                let v = clock.next_version(now, request.as_ref());
                if let Some(r) = &request {
                    prop_assert!(v > *r, "{} <= request {}", v, r);
                }
                prop_assert!(v.wall_ms >= now);
                if let Some(prev) = &last {
                    prop_assert!(v > *prev, "{} <= previous {}", v, prev);
                }
                prop_assert_eq!(&*v.node_id, "srv");
                last = Some(v);
            }
        }
    }
}
