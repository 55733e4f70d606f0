//! MQTT pub/sub: fan-in and fan-out at QoS 0 and 1.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes, BytesMut};
use mqkv_broker::codec::QoS;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::{connect_all, drive, Settings, Worker, DELIVERY_TIMEOUT, SETUP_TIMEOUT};
use crate::mqtt::{plain_publish, split_frame, within, Conn, PublishTemplate, DISCONNECT, PUBACK};
use crate::report::{new_histogram, Latency, RunResult};
use crate::servers::{self_cpu_seconds, Server};

/// One publisher's message in flight: which sequence number, and how many deliveries are
/// still due.
struct Slot {
    seq: AtomicU64,
    remaining: AtomicUsize,
    notify: Notify,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            notify: Notify::new(),
        }
    }

    /// Counts one delivery of `seq`; wakes the publisher at the last one.
    fn delivered(&self, seq: u64) {
        if self.seq.load(Ordering::Acquire) != seq {
            return;
        }
        let prev = self
            .remaining
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| r.checked_sub(1));
        if prev == Ok(1) {
            self.notify.notify_one();
        }
    }
}

/// Message payload header: publisher index, sequence number, send time (ns since `epoch`).
const HEADER: usize = 4 + 8 + 8;

fn parse_header(payload: &[u8]) -> Option<(usize, u64, u64)> {
    if payload.len() < HEADER {
        return None;
    }
    let mut p = payload;
    let idx = p.get_u32() as usize;
    let seq = p.get_u64();
    let sent = p.get_u64();
    Some((idx, seq, sent))
}

/// Reads deliveries and counts them against the publishers' slots until aborted.
async fn subscriber_loop(
    mut conn: Conn,
    slots: Arc<Vec<Slot>>,
    delivered: Arc<AtomicU64>,
) -> Result<()> {
    async {
        loop {
            while let Some(view) = conn.try_publish()? {
                if let Some((idx, seq, _)) = parse_header(&view.payload) {
                    delivered.fetch_add(1, Ordering::Relaxed);
                    if let Some(slot) = slots.get(idx) {
                        slot.delivered(seq);
                    }
                }
            }
            conn.flush_acks().await?;
            conn.fill().await?;
        }
    }
    .await
}

struct Publisher {
    conn: Conn,
    tpl: PublishTemplate,
    idx: usize,
    qos: QoS,
    fanout: usize,
    slots: Arc<Vec<Slot>>,
    epoch: Instant,
    payload_at: usize,
}

impl Worker for Publisher {
    async fn op(&mut self, seq: u64) -> Result<bool> {
        let slot = &self.slots[self.idx];
        slot.remaining.store(self.fanout, Ordering::Release);
        slot.seq.store(seq, Ordering::Release);
        let pid = self.conn.ids.next();
        self.tpl.set_packet_id(pid);
        let b = &mut self.tpl.bytes[self.payload_at..];
        b[4..12].copy_from_slice(&seq.to_be_bytes());
        let sent = self.epoch.elapsed().as_nanos() as u64;
        b[12..20].copy_from_slice(&sent.to_be_bytes());
        self.conn.send(&self.tpl.bytes).await?;
        if self.qos == QoS::AtLeastOnce {
            loop {
                let frame = self.conn.read_frame().await?;
                match frame.kind() {
                    PUBACK => {
                        let mut body = frame.body;
                        if body.len() >= 2 && body.get_u16() == pid {
                            if let Some(&code) = body.first() {
                                if code >= 0x80 {
                                    return Ok(false);
                                }
                            }
                            break;
                        }
                    }
                    DISCONNECT => bail!("server disconnected the publisher"),
                    _ => {}
                }
            }
        }
        let deadline = Instant::now() + DELIVERY_TIMEOUT;
        loop {
            if slot.remaining.load(Ordering::Acquire) == 0 {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, slot.notify.notified())
                .await
                .is_err()
            {
                // Lost (QoS 0 may drop); invalidate the slot and go on.
                slot.seq.store(0, Ordering::Release);
                return Ok(false);
            }
        }
    }
}

fn pubsub_payload(idx: usize, size: usize) -> Bytes {
    let mut p = BytesMut::with_capacity(size.max(HEADER));
    p.extend_from_slice(&(idx as u32).to_be_bytes());
    p.resize(size.max(HEADER), b'p');
    p.freeze()
}

pub async fn pubsub(
    fanin: bool,
    qos: QoS,
    server: &Server,
    clients: usize,
    s: &Settings,
) -> RunResult {
    let workload = if fanin {
        "pubsub-fanin"
    } else {
        "pubsub-fanout"
    };
    let workload = format!("{workload}{}", server.dial.wire().suffix());
    let mut r = RunResult::new(&workload, server.target, clients);
    r.qos = Some(qos as u8);
    r.value_size = Some(s.pubsub_payload.max(HEADER));
    r.unit = "msgs/s".to_owned();
    let (publishers, subscribers) = if fanin { (clients, 1) } else { (1, clients) };
    let addr = server.addr;
    let dial = &server.dial;
    let slots: Arc<Vec<Slot>> = Arc::new((0..publishers).map(|_| Slot::new()).collect());
    let delivered = Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    let size = s.pubsub_payload;
    let mut readers = JoinSet::new();
    let setup = async {
        let subs = connect_all(subscribers, move |i| {
            let dial = dial.clone();
            async move {
                let mut c = Conn::dial(&dial, addr, &format!("bench-sub-{i}")).await?;
                c.subscribe("bench/ps/+", qos).await?;
                Ok(c)
            }
        })
        .await?;
        for c in subs {
            readers.spawn(subscriber_loop(c, slots.clone(), delivered.clone()));
        }
        let pubs = connect_all(publishers, move |i| {
            let dial = dial.clone();
            async move { Conn::dial(&dial, addr, &format!("bench-pub-{i}")).await }
        })
        .await?;
        let workers: Vec<Publisher> = pubs
            .into_iter()
            .enumerate()
            .map(|(idx, conn)| {
                let payload = pubsub_payload(idx, size);
                let len = payload.len();
                let tpl =
                    PublishTemplate::new(&plain_publish(&format!("bench/ps/{idx}"), qos, payload));
                let payload_at = tpl.bytes.len() - len;
                Publisher {
                    conn,
                    tpl,
                    idx,
                    qos,
                    fanout: subscribers,
                    slots: slots.clone(),
                    epoch,
                    payload_at,
                }
            })
            .collect();
        Ok::<_, anyhow::Error>(workers)
    };
    match within(SETUP_TIMEOUT * 4, "set-up", setup).await {
        Ok(workers) => {
            let out = drive(workers, s, server).await;
            out.fill(&mut r, subscribers as f64);
            r.extra.insert(
                "publishes_per_s".into(),
                json!(out.ops as f64 / out.window.as_secs_f64()),
            );
            r.extra.insert("publishers".into(), json!(publishers));
            r.extra.insert("subscribers".into(), json!(subscribers));
        }
        Err(e) => r.failed = Some(format!("set-up: {e:#}")),
    }
    reader_failures(&mut readers, &mut r);
    r
}

/// Stops the background readers; one that already ended with an error fails the run.
pub(super) fn reader_failures(readers: &mut JoinSet<Result<()>>, r: &mut RunResult) {
    let mut errors = Vec::new();
    while let Some(joined) = readers.try_join_next() {
        match joined {
            Ok(Err(e)) => errors.push(format!("{e:#}")),
            Ok(Ok(())) => {}
            Err(e) => errors.push(format!("reader task: {e}")),
        }
    }
    readers.abort_all();
    if let Some(first) = errors.first() {
        if r.failed.is_none() {
            r.failed = Some(format!(
                "{} receiving connection(s) failed; first: {first}",
                errors.len()
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// QoS 1 latency at a fixed rate.

pub async fn rate(server: &Server, s: &Settings) -> RunResult {
    let mut r = RunResult::new("pubsub-rate", server.target, 1);
    r.qos = Some(1);
    r.value_size = Some(s.pubsub_payload.max(HEADER));
    r.unit = "msgs/s".to_owned();
    r.extra.insert("target_rate".into(), json!(s.rate));
    match rate_inner(server, s, &mut r).await {
        Ok(()) => {}
        Err(e) => r.failed = Some(format!("{e:#}")),
    }
    r
}

async fn rate_inner(server: &Server, s: &Settings, r: &mut RunResult) -> Result<()> {
    let addr = server.addr;
    let epoch = Instant::now();
    let hist = Arc::new(Mutex::new(new_histogram()));
    let received = Arc::new(AtomicU64::new(0));
    let mut sub = Conn::connect(addr, "bench-rate-sub").await?;
    sub.subscribe("bench/rate", QoS::AtLeastOnce).await?;
    let warm_end = s.warmup;
    let window_end = s.warmup + s.rate_duration;
    let (h, rc) = (hist.clone(), received.clone());
    let reader = tokio::spawn(async move {
        let result: Result<()> = async {
            loop {
                while let Some(view) = sub.try_publish()? {
                    if let Some((_, _, sent)) = parse_header(&view.payload) {
                        let now = epoch.elapsed().as_nanos() as u64;
                        let sent_at = Duration::from_nanos(sent);
                        if sent_at >= warm_end && sent_at < window_end {
                            rc.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut h) = h.lock() {
                                h.saturating_record(now.saturating_sub(sent));
                            }
                        }
                    }
                }
                sub.flush_acks().await?;
                sub.fill().await?;
            }
        }
        .await;
        result
    });
    let publisher = Conn::connect(addr, "bench-rate-pub").await?;
    let (mut rd, mut wr) = publisher
        .stream
        .into_tcp()
        .context("the fixed-rate run is over plain TCP")?
        .into_split();
    let acks = Arc::new(AtomicU64::new(0));
    let ack_count = acks.clone();
    let ack_reader = tokio::spawn(async move {
        let mut buf = BytesMut::with_capacity(4096);
        loop {
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            while let Ok(Some(frame)) = split_frame(&mut buf) {
                if frame.kind() == PUBACK {
                    ack_count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    let payload = pubsub_payload(0, s.pubsub_payload);
    let len = payload.len();
    let mut tpl = PublishTemplate::new(&plain_publish("bench/rate", QoS::AtLeastOnce, payload));
    let payload_at = tpl.bytes.len() - len;
    let period = Duration::from_nanos(1_000_000_000 / s.rate.max(1));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut ids = crate::mqtt::PacketIds::new();
    let mut sent_in_window = 0u64;
    let (srv0, me0) = (server.cpu_seconds(), self_cpu_seconds());
    let mut seq = 0u64;
    loop {
        ticker.tick().await;
        let now = epoch.elapsed();
        if now >= window_end {
            break;
        }
        seq += 1;
        tpl.set_packet_id(ids.next());
        let b = &mut tpl.bytes[payload_at..];
        b[4..12].copy_from_slice(&seq.to_be_bytes());
        let sent = epoch.elapsed();
        b[12..20].copy_from_slice(&(sent.as_nanos() as u64).to_be_bytes());
        wr.write_all(&tpl.bytes).await?;
        if sent >= warm_end {
            sent_in_window += 1;
        }
    }
    let elapsed_cpu = (server.cpu_seconds() - srv0, self_cpu_seconds() - me0);
    // Let the last messages arrive.
    tokio::time::sleep(Duration::from_millis(500)).await;
    ack_reader.abort();
    if reader.is_finished() {
        match reader.await {
            Ok(Err(e)) => bail!("the subscriber failed: {e:#}"),
            Err(e) => bail!("the subscriber task failed: {e}"),
            Ok(Ok(())) => {}
        }
    } else {
        reader.abort();
    }
    let got = received.load(Ordering::Relaxed);
    let total = (s.warmup + s.rate_duration).as_secs_f64();
    r.duration_s = s.rate_duration.as_secs_f64();
    r.ops = got;
    r.throughput = got as f64 / s.rate_duration.as_secs_f64();
    r.errors = sent_in_window.saturating_sub(got);
    r.server_cpu = elapsed_cpu.0 / total;
    r.bench_cpu = elapsed_cpu.1 / total;
    r.extra.insert("sent".into(), json!(sent_in_window));
    r.extra
        .insert("pubacks".into(), json!(acks.load(Ordering::Relaxed)));
    if let Ok(h) = hist.lock() {
        r.latency_us = Latency::from_ns(&h);
    }
    Ok(())
}
