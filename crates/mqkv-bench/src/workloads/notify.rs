//! Notification fan-out: one key, many observers; or, with pattern watches, many keys (the
//! setter goes round them) and every observer watching them all through one pattern.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use mqkv_protocol::Command;
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::mqtt::{within, Conn};
use crate::report::{new_histogram, Latency, RunResult};
use crate::servers::Server;
use crate::store::{key_bytes, StoreClient};

use super::pubsub::reader_failures;
use super::{connect_all, drive, Settings, Worker, DELIVERY_TIMEOUT, SETUP_TIMEOUT};

pub const NOTIFY_KEY: u64 = 9_999_999;

/// The first of the keys the pattern fan-out changes, and how many there are: the pattern is
/// this key with its last three digits `???`.
const PATTERN_KEYS_FROM: u64 = 8_000_000;
const PATTERN_KEYS: u64 = 1_000;

/// The glob matching every key of the pattern fan-out (its first letter as a class, so that
/// the request is not taken for one naming a key).
fn pattern_glob() -> Vec<u8> {
    let mut glob = key_bytes(PATTERN_KEYS_FROM);
    let n = glob.len();
    glob[n - 3..].copy_from_slice(b"???");
    let mut class = b"[".to_vec();
    class.push(glob[0]);
    class.push(b']');
    class.extend_from_slice(&glob[1..]);
    class
}

struct Round {
    seq: AtomicU64,
    remaining: AtomicUsize,
    last_ns: AtomicU64,
    notify: Notify,
}

struct Setter {
    client: StoreClient,
    round: Arc<Round>,
    observers: usize,
    /// Whether each SET goes to the next of the pattern's keys (else always to one key).
    rotate: bool,
    epoch: Instant,
    after_response: Arc<Mutex<Histogram<u64>>>,
}

impl Worker for Setter {
    async fn op(&mut self, seq: u64) -> Result<bool> {
        self.round.last_ns.store(0, Ordering::Release);
        self.round
            .remaining
            .store(self.observers, Ordering::Release);
        self.round.seq.store(seq, Ordering::Release);
        let key = if self.rotate {
            PATTERN_KEYS_FROM + seq % PATTERN_KEYS
        } else {
            NOTIFY_KEY
        };
        if !self.client.set_with_value_digits(key, seq).await? {
            return Ok(false);
        }
        let answered = self.epoch.elapsed().as_nanos() as u64;
        let deadline = Instant::now() + DELIVERY_TIMEOUT;
        loop {
            if self.round.remaining.load(Ordering::Acquire) == 0 {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, self.round.notify.notified())
                .await
                .is_err()
            {
                self.round.seq.store(0, Ordering::Release);
                return Ok(false);
            }
        }
        let last = self.round.last_ns.load(Ordering::Acquire);
        if let Ok(mut h) = self.after_response.lock() {
            // Time from the SET response to the last observer notified; 0 when every
            // notification arrived before the response.
            h.saturating_record(last.saturating_sub(answered).max(1_000));
        }
        Ok(true)
    }
}

async fn observer_loop(mut conn: Conn, round: Arc<Round>, epoch: Instant) -> Result<()> {
    async {
        loop {
            while let Some(view) = conn.try_publish()? {
                if !view
                    .topic
                    .starts_with(mqkv_protocol::NOTIFY_TOPIC_PREFIX.as_bytes())
                {
                    continue;
                }
                // `...$16\r\n<16 digits>\r\n`: the value is the setter's sequence number.
                let p = &view.payload;
                if p.len() < 18 {
                    continue;
                }
                let digits = &p[p.len() - 18..p.len() - 2];
                let seq = std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse::<u64>().ok());
                let Some(seq) = seq else { continue };
                if round.seq.load(Ordering::Acquire) != seq {
                    continue;
                }
                let now = epoch.elapsed().as_nanos() as u64;
                round.last_ns.fetch_max(now, Ordering::AcqRel);
                let prev = round
                    .remaining
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1));
                if prev == Ok(1) {
                    round.notify.notify_one();
                }
            }
            conn.flush_acks().await?;
            conn.fill().await?;
        }
    }
    .await
}

/// Key notification fan-out to `observers`: of one key each observer watches exactly, or (with
/// `pattern`) of many keys each observer watches through one pattern.
pub async fn notify(server: &Server, observers: usize, pattern: bool, s: &Settings) -> RunResult {
    let name = if pattern { "notify-pattern" } else { "notify" };
    let mut r = RunResult::new(name, server.target, observers);
    r.value_size = Some(16);
    r.unit = "notifications/s".to_owned();
    let addr = server.addr;
    let epoch = Instant::now();
    let round = Arc::new(Round {
        seq: AtomicU64::new(0),
        remaining: AtomicUsize::new(0),
        last_ns: AtomicU64::new(0),
        notify: Notify::new(),
    });
    let after = Arc::new(Mutex::new(new_histogram()));
    let mut readers = JoinSet::new();
    let setup = async {
        let obs = connect_all(observers, move |i| async move {
            let mut c =
                StoreClient::connect(addr, format!("bench-obs-{i}"), 10_000 + i as u64, 16).await?;
            let command = if pattern {
                Command::KeyNotifyPattern {
                    pattern: Bytes::from(pattern_glob()),
                    stop: false,
                }
            } else {
                Command::KeyNotify {
                    key: Bytes::from(key_bytes(NOTIFY_KEY)),
                    stop: false,
                }
            };
            let answer = c.call_command(&command, NOTIFY_KEY).await?;
            if !answer.status_ok || &answer.payload[..] != b"+OK\r\n" {
                bail!("KEYNOTIFY answered {:?}", answer.payload);
            }
            Ok(c.conn)
        })
        .await?;
        for c in obs {
            readers.spawn(observer_loop(c, round.clone(), epoch));
        }
        let client = StoreClient::connect(addr, "bench-setter".to_owned(), 1, 16).await?;
        Ok::<_, anyhow::Error>(vec![Setter {
            client,
            round: round.clone(),
            observers,
            rotate: pattern,
            epoch,
            after_response: after.clone(),
        }])
    };
    match within(SETUP_TIMEOUT * 4, "set-up", setup).await {
        Ok(workers) => {
            let out = drive(workers, s, server).await;
            out.fill(&mut r, observers as f64);
            r.extra.insert(
                "sets_per_s".into(),
                json!(out.ops as f64 / out.window.as_secs_f64()),
            );
            if let Ok(h) = after.lock() {
                r.extra.insert(
                    "after_response_latency_us".into(),
                    json!(Latency::from_ns(&h)),
                );
            }
        }
        Err(e) => r.failed = Some(format!("set-up: {e:#}")),
    }
    reader_failures(&mut readers, &mut r);
    r
}
