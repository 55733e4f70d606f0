//! Memory.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::BytesMut;
use serde_json::json;
use tokio::task::JoinSet;

use crate::mqtt::within;
use crate::report::{new_histogram, Latency, RunResult};
use crate::servers::Server;
use crate::store::key_len;

use super::kv::kv_connect;
use super::storm::handshake;
use super::{connect_all, OP_TIMEOUT};

async fn settle_rss(server: &Server, wait: Duration) -> Result<u64> {
    tokio::time::sleep(wait).await;
    server.rss_bytes()
}

/// Resident memory once it holds still: sampled every 250 ms until a 3 s
/// span of samples (13 in a row) stays within 1 % (at most 30 s), so a
/// snapshot being serialized or written in the background, which can hold
/// the RSS level for a second or more, is not taken for the steady state.
/// Also returns the highest sample seen on the way.
async fn steady_rss(server: &Server) -> Result<(u64, u64)> {
    const SPAN: usize = 13;
    let mut samples = vec![settle_rss(server, Duration::from_secs(1)).await?];
    let mut level = None;
    for _ in 0..120 {
        samples.push(settle_rss(server, Duration::from_millis(250)).await?);
        level = steady_level(&samples, SPAN);
        if level.is_some() {
            break;
        }
    }
    let last = samples.last().copied().unwrap_or(0);
    let peak = samples.iter().copied().max().unwrap_or(last);
    Ok((level.unwrap_or(last), peak))
}

/// The newest sample, if the newest `span` samples are within 1 % of their
/// lowest.
fn steady_level(samples: &[u64], span: usize) -> Option<u64> {
    let window = samples.get(samples.len().checked_sub(span)?..)?;
    let low = window.iter().copied().min()?;
    let high = window.iter().copied().max()?;
    ((high - low) * 100 <= low).then(|| *window.last().unwrap_or(&low))
}

pub async fn mem_idle(server: &Server, connections: usize) -> RunResult {
    let mut r = RunResult::new("mem-idle-conns", server.target, connections);
    r.unit = "connects/s".to_owned();
    let run = async {
        let before = settle_rss(server, Duration::from_millis(500)).await?;
        let addr = server.addr;
        let t0 = Instant::now();
        let streams = connect_all(connections, move |i| async move {
            let mut buf = BytesMut::with_capacity(64);
            handshake(addr, &format!("bench-idle-{i}"), &mut buf).await
        })
        .await?;
        let took = t0.elapsed();
        let after = settle_rss(server, Duration::from_secs(1)).await?;
        let per = (after as f64 - before as f64) / connections as f64;
        r.ops = connections as u64;
        r.duration_s = took.as_secs_f64();
        r.throughput = connections as f64 / took.as_secs_f64();
        r.extra.insert("rss_before".into(), json!(before));
        r.extra.insert("rss_after".into(), json!(after));
        r.extra.insert("bytes_per_connection".into(), json!(per));
        drop(streams);
        Ok::<_, anyhow::Error>(())
    };
    if let Err(e) = within(Duration::from_secs(300), "idle connections", run).await {
        r.failed = Some(format!("{e:#}"));
    }
    r
}

pub async fn mem_keys(server: &Server, keys: u64) -> RunResult {
    const VALUE: usize = 100;
    const LOADERS: usize = 64;
    let mut r = RunResult::new("mem-keys", server.target, LOADERS);
    r.value_size = Some(VALUE);
    r.unit = "SET/s while loading".to_owned();
    let target = server.target;
    let addr = server.addr;
    let run = async {
        let before = settle_rss(server, Duration::from_millis(500)).await?;
        let conns = connect_all(LOADERS, move |i| kv_connect(target, addr, i, VALUE)).await?;
        let t0 = Instant::now();
        let mut set = JoinSet::new();
        for (i, mut c) in conns.into_iter().enumerate() {
            set.spawn(async move {
                let mut k = i as u64;
                let mut refused = 0u64;
                // Each SET's latency: a stall while the store holds more and more keys (a
                // snapshot of them, a rehash) shows in the tail.
                let mut hist = new_histogram();
                while k < keys {
                    let sent = Instant::now();
                    if !within(OP_TIMEOUT, "SET", c.set(k)).await? {
                        refused += 1;
                    }
                    hist.saturating_record(sent.elapsed().as_nanos() as u64);
                    k += LOADERS as u64;
                }
                Ok::<_, anyhow::Error>((refused, hist))
            });
        }
        let mut refused = 0;
        let mut hist = new_histogram();
        while let Some(j) = set.join_next().await {
            let (n, h) = j.context("loader task")??;
            refused += n;
            let _ = hist.add(&h);
        }
        let took = t0.elapsed();
        r.latency_us = Latency::from_ns(&hist);
        let (after, peak) = steady_rss(server).await?;
        let per_key = (after as f64 - before as f64) / keys as f64;
        let payload = (VALUE + key_len()) as f64;
        r.ops = keys;
        r.errors = refused;
        r.duration_s = took.as_secs_f64();
        r.throughput = keys as f64 / took.as_secs_f64();
        r.extra.insert("keys".into(), json!(keys));
        r.extra.insert("key_len".into(), json!(key_len()));
        r.extra.insert("value_len".into(), json!(VALUE));
        r.extra.insert("rss_before".into(), json!(before));
        r.extra.insert("rss_after".into(), json!(after));
        r.extra.insert("rss_peak_after_load".into(), json!(peak));
        r.extra.insert("bytes_per_key".into(), json!(per_key));
        r.extra
            .insert("overhead_bytes_per_key".into(), json!(per_key - payload));
        Ok::<_, anyhow::Error>(())
    };
    if let Err(e) = within(Duration::from_secs(900), "loading keys", run).await {
        r.failed = Some(format!("{e:#}"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::steady_level;

    #[test]
    fn a_level_is_steady_only_when_the_whole_span_holds_still() {
        // Too few samples.
        assert_eq!(steady_level(&[100, 100], 3), None);
        // A plateau shorter than the span (a snapshot held for a moment) is not the level.
        assert_eq!(steady_level(&[100, 150, 150, 100, 100], 3), None);
        assert_eq!(steady_level(&[100, 150, 150, 100, 100, 100], 3), Some(100));
        // Within 1 % of the lowest sample counts as still; the newest sample is the level.
        assert_eq!(steady_level(&[1000, 1005, 1010], 3), Some(1010));
        assert_eq!(steady_level(&[1000, 1005, 1011], 3), None);
    }
}
