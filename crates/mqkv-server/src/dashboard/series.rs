//! The throughput the dashboard charts: a sample of the broker's and the store's counters
//! every few seconds, the last minutes of them kept in memory.

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use mqkv_broker::Broker;
use parking_lot::Mutex;
use serde::Serialize;

use crate::statestore::StoreCounters;

/// How often a sample is taken.
pub const EVERY: Duration = Duration::from_secs(2);

/// Samples kept: ten minutes.
const KEPT: usize = 300;

/// Rates over one interval, per second.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Sample {
    /// Unix ms at the end of the interval.
    pub at_ms: u64,
    pub publishes_received: f64,
    pub publishes_sent: f64,
    /// State store requests of every kind.
    pub store_requests: f64,
    /// Connected clients at the end of the interval.
    pub connected: u64,
}

/// Counter totals at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    publishes_received: u64,
    publishes_sent: u64,
    store_requests: u64,
}

/// The kept samples.
#[derive(Default)]
pub struct Series {
    samples: Mutex<VecDeque<Sample>>,
}

impl Series {
    /// Starts sampling `broker` and `counters`; stops when the series is dropped.
    pub fn start(broker: Broker, counters: Arc<StoreCounters>) -> Arc<Series> {
        let series = Arc::new(Series::default());
        let weak = Arc::downgrade(&series);
        tokio::spawn(sample_loop(weak, broker, counters));
        series
    }

    /// The kept samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.lock().iter().copied().collect()
    }

    fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock();
        if samples.len() >= KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }
}

async fn sample_loop(series: Weak<Series>, broker: Broker, counters: Arc<StoreCounters>) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<(Totals, std::time::Instant)> = None;
    loop {
        tick.tick().await;
        let Some(series) = series.upgrade() else {
            return;
        };
        let totals = totals(&broker, &counters);
        let now = std::time::Instant::now();
        if let Some((before, at)) = last {
            let secs = now.duration_since(at).as_secs_f64().max(0.001);
            let rate = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
            series.push(Sample {
                at_ms: crate::statestore::now_ms(),
                publishes_received: rate(totals.publishes_received, before.publishes_received),
                publishes_sent: rate(totals.publishes_sent, before.publishes_sent),
                store_requests: rate(totals.store_requests, before.store_requests),
                connected: broker.connection_count() as u64,
            });
        }
        last = Some((totals, now));
    }
}

fn totals(broker: &Broker, c: &StoreCounters) -> Totals {
    let stats = broker.counters();
    Totals {
        publishes_received: stats.publishes_received,
        publishes_sent: stats.publishes_sent,
        store_requests: c.total(|s| &s.insertions)
            + c.total(|s| &s.modifications)
            + c.total(|s| &s.deletions)
            + c.total(|s| &s.retrievals)
            + c.total(|s| &s.keynotify_requests)
            + c.total(|s| &s.scans),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_samples_go_first() {
        let s = Series::default();
        for i in 0..(KEPT as u64 + 5) {
            s.push(Sample {
                at_ms: i,
                publishes_received: 0.0,
                publishes_sent: 0.0,
                store_requests: 0.0,
                connected: 0,
            });
        }
        let kept = s.samples();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].at_ms, 5);
        assert_eq!(kept[KEPT - 1].at_ms, KEPT as u64 + 4);
    }
}
