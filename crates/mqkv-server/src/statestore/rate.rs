//! A limit on state store requests per second per connection: a token bucket per connection
//! that holds a second's worth of requests. A request over the limit is answered
//! `-ERR the quota has been exceeded` at once.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;

/// One connection's bucket.
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// The buckets of every connection that made a request.
pub(super) struct RateLimit {
    per_second: f64,
    buckets: Mutex<HashMap<u64, Bucket>>,
}

impl RateLimit {
    /// A limit of `per_second` requests per connection.
    pub(super) fn new(per_second: u32) -> RateLimit {
        RateLimit {
            per_second: f64::from(per_second.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request of `connection` at `now`; false when it is over the limit.
    pub(super) fn take(&self, connection: u64, now: Instant) -> bool {
        let mut buckets = self.buckets.lock();
        let bucket = buckets.entry(connection).or_insert(Bucket {
            tokens: self.per_second,
            last: now,
        });
        let refill = now.saturating_duration_since(bucket.last).as_secs_f64() * self.per_second;
        bucket.tokens = (bucket.tokens + refill).min(self.per_second);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Forgets a connection that ended.
    pub(super) fn forget(&self, connection: u64) {
        self.buckets.lock().remove(&connection);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_second_s_worth_then_the_refill_rate() {
        let limit = RateLimit::new(10);
        let t0 = Instant::now();
        assert_eq!((0..15).filter(|_| limit.take(1, t0)).count(), 10);
        // Another connection has its own bucket.
        assert!(limit.take(2, t0));
        // 0.5 s later: five more.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!((0..15).filter(|_| limit.take(1, t1)).count(), 5);
        // Never more than a second's worth, however long the wait.
        let t2 = t1 + Duration::from_secs(100);
        assert_eq!((0..30).filter(|_| limit.take(1, t2)).count(), 10);
        limit.forget(1);
        assert!(limit.take(1, t2));
    }
}
