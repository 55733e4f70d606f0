//! The client's hybrid logical clock: stamps `__ts` on every request and
//! absorbs the versions the server sends back.
//!
//! Invariants:
//! - [`ClientClock::tick`] never returns a value lower than or equal to one
//!   it returned before, nor lower than a timestamp it merged.
//! - A received timestamp more than [`MAX_CLOCK_SKEW_MS`] ahead of the local
//!   wall clock is not merged: the server would refuse every later request
//!   stamped from a clock pushed that far ahead (`TimestampSkew`).

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mqkv_protocol::{Hlc, MAX_CLOCK_SKEW_MS, MAX_COUNTER};

/// Milliseconds since the Unix epoch by the local wall clock.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A lower-case, hyphenated, random (version 4) UUID, the node id form the
/// Rust and .NET SDKs use.
pub(crate) fn random_uuid() -> String {
    let b = random_uuid_bytes();
    let hex = |range: std::ops::Range<usize>| -> String {
        b[range].iter().map(|x| format!("{x:02x}")).collect()
    };
    format!(
        "{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

/// 16 random bytes laid out as a version 4 UUID: what the Rust SDK sends as
/// correlation data.
pub(crate) fn random_uuid_bytes() -> [u8; 16] {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// `from + d`, or a point decades away when that is not representable: a
/// caller's "wait practically forever" must not overflow.
pub(crate) fn after(from: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    from.checked_add(d).unwrap_or_else(|| from + FAR)
}

#[derive(Debug)]
pub(crate) struct ClientClock {
    node_id: String,
    /// `(wall_ms, counter)` of the last value handed out or merged.
    state: Mutex<(u64, u64)>,
}

impl ClientClock {
    pub(crate) fn new() -> ClientClock {
        ClientClock {
            node_id: random_uuid(),
            state: Mutex::new((0, 0)),
        }
    }

    /// The timestamp for an outgoing request.
    pub(crate) fn tick(&self) -> Hlc {
        self.tick_at(wall_ms())
    }

    fn tick_at(&self, now: u64) -> Hlc {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (wall, counter) = *state;
        *state = if now > wall {
            (now, 0)
        } else {
            bump(wall, counter)
        };
        Hlc::new(state.0, state.1, self.node_id.clone())
    }

    /// Absorbs a timestamp received from the server. Returns false, and
    /// leaves the clock alone, if it lies too far in the future.
    pub(crate) fn merge(&self, other: &Hlc) -> bool {
        self.merge_at(other, wall_ms())
    }

    fn merge_at(&self, other: &Hlc, now: u64) -> bool {
        if other.wall_ms > now.saturating_add(MAX_CLOCK_SKEW_MS) {
            return false;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (wall, counter) = *state;
        if (other.wall_ms, other.counter) > (wall, counter) {
            // Later than anything seen: adopt it, so the next tick is after it.
            *state = (other.wall_ms, other.counter.min(MAX_COUNTER));
        }
        true
    }
}

fn bump(wall: u64, counter: u64) -> (u64, u64) {
    if counter >= MAX_COUNTER {
        (wall.saturating_add(1), 0)
    } else {
        (wall, counter + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_strictly_increase() {
        let clock = ClientClock::new();
        let a = clock.tick_at(1_000);
        let b = clock.tick_at(1_000);
        let c = clock.tick_at(999);
        let d = clock.tick_at(1_001);
        assert!(a < b && b < c && c < d, "{a} {b} {c} {d}");
        assert_eq!(d.counter, 0);
    }

    #[test]
    fn merge_moves_past_received_versions() {
        let clock = ClientClock::new();
        assert!(clock.merge_at(&Hlc::new(5_000, 7, "srv"), 1_000));
        let next = clock.tick_at(1_000);
        assert_eq!((next.wall_ms, next.counter), (5_000, 8));
        // An older version changes nothing.
        assert!(clock.merge_at(&Hlc::new(10, 0, "srv"), 1_000));
        assert_eq!(clock.tick_at(1_000).counter, 9);
    }

    #[test]
    fn far_future_versions_are_not_merged() {
        let clock = ClientClock::new();
        let far = Hlc::new(1_000 + MAX_CLOCK_SKEW_MS + 1, 0, "srv");
        assert!(!clock.merge_at(&far, 1_000));
        assert_eq!(clock.tick_at(1_000).wall_ms, 1_000);
    }

    #[test]
    fn node_id_is_a_v4_uuid() {
        let id = random_uuid();
        let parts: Vec<&str> = id.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12]
        );
        assert!(parts[2].starts_with('4'));
        assert!(id
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert!(!id.contains(':'));
    }

    #[test]
    fn far_deadlines_do_not_overflow() {
        let now = tokio::time::Instant::now();
        assert!(after(now, Duration::MAX) > now);
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }

    #[test]
    fn counter_never_exceeds_the_dotnet_limit() {
        let clock = ClientClock::new();
        assert!(clock.merge_at(&Hlc::new(1_000, MAX_COUNTER, "srv"), 1_000));
        let next = clock.tick_at(1_000);
        assert_eq!((next.wall_ms, next.counter), (1_001, 0));
    }
}
