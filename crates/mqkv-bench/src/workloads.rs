//! The workloads. Every closed-loop workload runs one task per simulated client, each with
//! exactly one operation in flight; a warm-up period comes before the measured window, and an
//! operation counts when it started inside the window.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::{Buf, Bytes, BytesMut};
use hdrhistogram::Histogram;
use mqkv_broker::codec::QoS;
use mqkv_protocol::Command;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use crate::mqtt::{
    connect_packet, plain_publish, split_frame, within, Conn, PublishTemplate, DISCONNECT, PUBACK,
};
use crate::report::{new_histogram, Latency, RunResult};
use crate::servers::{self_cpu_seconds, Server, Target};
use crate::store::{key_bytes, key_len, RedisClient, StoreClient};

/// Settings shared by every workload.
#[derive(Debug, Clone)]
pub struct Settings {
    pub duration: Duration,
    pub warmup: Duration,
    pub rate_duration: Duration,
    pub rate: u64,
    pub pubsub_payload: usize,
    pub idle_connections: usize,
    pub stored_keys: u64,
    pub keys_per_client: u64,
}

const OP_TIMEOUT: Duration = Duration::from_secs(10);
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(2);
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// One simulated client of a closed-loop workload.
pub trait Worker: Send + 'static {
    /// Runs one operation. `Ok(false)` is an unexpected answer or a lost message; `Err` ends
    /// this client.
    fn op(&mut self, seq: u64) -> impl Future<Output = Result<bool>> + Send;
}

/// What a closed-loop run measured.
pub struct Outcome {
    pub ops: u64,
    pub errors: u64,
    pub hist: Histogram<u64>,
    pub window: Duration,
    pub server_cpu: f64,
    pub bench_cpu: f64,
    pub failures: Vec<String>,
}

impl Outcome {
    pub fn fill(&self, r: &mut RunResult, per_op: f64) {
        r.duration_s = self.window.as_secs_f64();
        r.ops = self.ops;
        r.throughput = self.ops as f64 * per_op / self.window.as_secs_f64();
        r.latency_us = Latency::from_ns(&self.hist);
        r.errors = self.errors;
        r.server_cpu = self.server_cpu;
        r.bench_cpu = self.bench_cpu;
        if let Some(first) = self.failures.first() {
            r.failed = Some(format!(
                "{} of the clients failed; first: {first}",
                self.failures.len()
            ));
        }
    }
}

/// Runs every worker in its own task for warm-up plus the window.
pub async fn drive<W: Worker>(workers: Vec<W>, s: &Settings, server: &Server) -> Outcome {
    drive_measuring(workers, s, || server.cpu_seconds()).await
}

/// [`drive`], with the server CPU time so far given by `server_cpu` (seconds).
pub async fn drive_measuring<W: Worker>(
    workers: Vec<W>,
    s: &Settings,
    server_cpu: impl Fn() -> f64,
) -> Outcome {
    let (tx, rx) = watch::channel::<Option<(Instant, Instant)>>(None);
    let mut set = JoinSet::new();
    for mut w in workers {
        let mut rx = rx.clone();
        set.spawn(async move {
            let mut hist = new_histogram();
            let mut ops = 0u64;
            let mut errors = 0u64;
            let window = match rx.wait_for(|w| w.is_some()).await {
                Ok(w) => *w,
                Err(_) => None,
            };
            let Some((start, end)) = window else {
                return (hist, ops, errors, Some("no window".to_owned()));
            };
            let mut seq = 0u64;
            let mut t0 = Instant::now();
            while t0 < end {
                seq += 1;
                let r = w.op(seq).await;
                let t1 = Instant::now();
                match r {
                    Ok(true) if t0 >= start => {
                        hist.saturating_record((t1 - t0).as_nanos() as u64);
                        ops += 1;
                    }
                    Ok(false) if t0 >= start => errors += 1,
                    Ok(_) => {}
                    Err(e) => return (hist, ops, errors, Some(format!("{e:#}"))),
                }
                // The end of one request is the start of the next.
                t0 = t1;
            }
            (hist, ops, errors, None)
        });
    }
    let start = Instant::now() + s.warmup;
    let end = start + s.duration;
    let _ = tx.send(Some((start, end)));
    tokio::time::sleep_until(start.into()).await;
    let (srv0, me0) = (server_cpu(), self_cpu_seconds());
    tokio::time::sleep_until(end.into()).await;
    let (srv1, me1) = (server_cpu(), self_cpu_seconds());
    let mut out = Outcome {
        ops: 0,
        errors: 0,
        hist: new_histogram(),
        window: s.duration,
        server_cpu: (srv1 - srv0) / s.duration.as_secs_f64(),
        bench_cpu: (me1 - me0) / s.duration.as_secs_f64(),
        failures: Vec::new(),
    };
    let (joined, timed_out) = join_clients(set, end).await;
    out.failures.extend(timed_out);
    for joined in joined {
        match joined {
            Ok((hist, ops, errors, failure)) => {
                let _ = out.hist.add(&hist);
                out.ops += ops;
                out.errors += errors;
                if let Some(f) = failure {
                    out.failures.push(f);
                }
            }
            Err(e) => out.failures.push(format!("client task: {e}")),
        }
    }
    out
}

/// Joins every client task of a run whose load ended at `end`. No timer per request or per
/// client: a client still waiting for an answer `OP_TIMEOUT` after that has waited longer than
/// that, and is stopped; the failure returned says how many were.
pub(crate) async fn join_clients<T: 'static>(
    mut set: JoinSet<T>,
    end: Instant,
) -> (Vec<Result<T, tokio::task::JoinError>>, Option<String>) {
    let mut joined = Vec::with_capacity(set.len());
    loop {
        match tokio::time::timeout_at((end + OP_TIMEOUT).into(), set.join_next()).await {
            Ok(Some(j)) => joined.push(j),
            Ok(None) => return (joined, None),
            Err(_) => {
                let failure = format!(
                    "{} of the clients timed out after {OP_TIMEOUT:?} waiting for a response",
                    set.len()
                );
                set.abort_all();
                while set.join_next().await.is_some() {}
                return (joined, Some(failure));
            }
        }
    }
}

/// Connects `n` clients with `make`, at most 64 at a time.
pub(crate) async fn connect_all<T, F, Fut>(n: usize, make: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T>> + Send + 'static,
{
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let mut set = JoinSet::new();
    for i in 0..n {
        if set.len() >= 64 {
            if let Some(j) = set.join_next().await {
                let (idx, v) = j.context("connect task")?;
                out[idx] = Some(within(SETUP_TIMEOUT, "connect", async { v }).await?);
            }
        }
        let fut = make(i);
        set.spawn(async move { (i, fut.await) });
    }
    while let Some(j) = set.join_next().await {
        let (idx, v) = j.context("connect task")?;
        out[idx] = Some(v?);
    }
    out.into_iter()
        .map(|v| v.context("client missing"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// State store: SET, GET, 90/10 mix.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvMode {
    Set,
    Get,
    Mix,
}

impl KvMode {
    pub fn name(self) -> &'static str {
        match self {
            KvMode::Set => "set",
            KvMode::Get => "get",
            KvMode::Mix => "mix",
        }
    }
}

enum KvConn {
    Mqkv(StoreClient),
    Redis(RedisClient),
}

impl KvConn {
    async fn set(&mut self, key: u64) -> Result<bool> {
        match self {
            KvConn::Mqkv(c) => c.set(key).await,
            KvConn::Redis(c) => c.set(key).await,
        }
    }

    async fn get(&mut self, key: u64) -> Result<bool> {
        match self {
            KvConn::Mqkv(c) => c.get(key).await,
            KvConn::Redis(c) => c.get(key).await,
        }
    }
}

pub(crate) struct KvWorker {
    conn: KvConn,
    mode: KvMode,
    base: u64,
    keys: u64,
    rng: u64,
}

impl Worker for KvWorker {
    async fn op(&mut self, seq: u64) -> Result<bool> {
        let key = self.base + seq % self.keys;
        let is_get = match self.mode {
            KvMode::Set => false,
            KvMode::Get => true,
            KvMode::Mix => {
                // xorshift64: 90 % GET, 10 % SET.
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                !self.rng.is_multiple_of(10)
            }
        };
        if is_get {
            self.conn.get(key).await
        } else {
            self.conn.set(key).await
        }
    }
}

async fn kv_connect(
    target: Target,
    addr: SocketAddr,
    i: usize,
    value_size: usize,
) -> Result<KvConn> {
    Ok(if target.is_redis() {
        KvConn::Redis(RedisClient::connect(addr, value_size).await?)
    } else {
        KvConn::Mqkv(
            StoreClient::connect(addr, format!("bench-kv-{i}"), i as u64, value_size).await?,
        )
    })
}

pub async fn kv(
    mode: KvMode,
    server: &Server,
    clients: usize,
    value_size: usize,
    s: &Settings,
) -> RunResult {
    let mut r = RunResult::new(mode.name(), server.target, clients);
    r.value_size = Some(value_size);
    let setup = kv_workers(mode, server, clients, value_size, s.keys_per_client);
    match within(SETUP_TIMEOUT * 4, "set-up", setup).await {
        Ok(workers) => drive(workers, s, server).await.fill(&mut r, 1.0),
        Err(e) => r.failed = Some(format!("set-up: {e:#}")),
    }
    r
}

/// Connects `clients` state store clients to `server`, each with `keys` keys of its own, and
/// for reading workloads writes every key a client reads first.
pub(crate) async fn kv_workers(
    mode: KvMode,
    server: &Server,
    clients: usize,
    value_size: usize,
    keys: u64,
) -> Result<Vec<KvWorker>> {
    let target = server.target;
    let addr = server.addr;
    let conns = connect_all(clients, move |i| kv_connect(target, addr, i, value_size)).await?;
    let mut workers = Vec::with_capacity(clients);
    for (i, conn) in conns.into_iter().enumerate() {
        workers.push(KvWorker {
            conn,
            mode,
            base: i as u64 * keys,
            keys,
            rng: 0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1),
        });
    }
    if mode == KvMode::Set {
        return Ok(workers);
    }
    // Every key a client reads exists before the window opens.
    let mut set = JoinSet::new();
    for mut w in workers {
        set.spawn(async move {
            for k in 0..w.keys {
                if !w.conn.set(w.base + k).await? {
                    bail!("preloading key {} was refused", w.base + k);
                }
            }
            Ok(w)
        });
    }
    let mut loaded = Vec::with_capacity(clients);
    while let Some(j) = set.join_next().await {
        loaded.push(j.context("preload task")??);
    }
    Ok(loaded)
}

// ---------------------------------------------------------------------------------------------
// State store: SET pipelined on one connection.

/// Keys one pipelining client cycles through.
const PIPELINE_KEYS: u64 = 1024;

enum PipeConn {
    Mqkv(StoreClient),
    Redis(RedisClient),
}

/// SET over one connection with `depth` requests in flight, as an application makes concurrent
/// calls through one SDK client (or one Redis connection, pipelining). Each time answers
/// arrive, as many new requests go out, in one write. Answers come back in request order on
/// both servers; one that does not is counted as an error. Latency is from a request's write
/// to its answer's read. The `clients` column holds the depth.
pub async fn pipelined(
    server: &Server,
    depth: usize,
    value_size: usize,
    s: &Settings,
) -> RunResult {
    let mut r = RunResult::new("set-pipelined", server.target, depth);
    r.value_size = Some(value_size);
    let conn = if server.target.is_redis() {
        within(
            SETUP_TIMEOUT,
            "connect",
            RedisClient::connect(server.addr, value_size),
        )
        .await
        .map(PipeConn::Redis)
    } else {
        within(
            SETUP_TIMEOUT,
            "connect",
            StoreClient::connect(server.addr, "bench-pipe".to_owned(), 0, value_size),
        )
        .await
        .map(PipeConn::Mqkv)
    };
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            r.failed = Some(format!("set-up: {e:#}"));
            return r;
        }
    };
    let start = Instant::now() + s.warmup;
    let end = start + s.duration;
    let run = tokio::spawn(pipeline_loop(conn, depth, start, end));
    tokio::time::sleep_until(start.into()).await;
    let (srv0, me0) = (server.cpu_seconds(), self_cpu_seconds());
    tokio::time::sleep_until(end.into()).await;
    let (srv1, me1) = (server.cpu_seconds(), self_cpu_seconds());
    let joined = tokio::time::timeout_at((end + OP_TIMEOUT).into(), run).await;
    let (hist, ops, errors) = match joined {
        Ok(Ok(Ok(counts))) => counts,
        Ok(Ok(Err(e))) => {
            r.failed = Some(format!("{e:#}"));
            return r;
        }
        Ok(Err(e)) => {
            r.failed = Some(format!("client task: {e}"));
            return r;
        }
        Err(_) => {
            r.failed = Some(format!("no answer {OP_TIMEOUT:?} after the window ended"));
            return r;
        }
    };
    Outcome {
        ops,
        errors,
        hist,
        window: s.duration,
        server_cpu: (srv1 - srv0) / s.duration.as_secs_f64(),
        bench_cpu: (me1 - me0) / s.duration.as_secs_f64(),
        failures: Vec::new(),
    }
    .fill(&mut r, 1.0);
    r.extra.insert("depth".into(), json!(depth));
    r
}

/// Keeps `depth` SETs in flight until `end`, then collects the answers still due. Counts the
/// requests written from `start` on.
async fn pipeline_loop(
    mut conn: PipeConn,
    depth: usize,
    start: Instant,
    end: Instant,
) -> Result<(Histogram<u64>, u64, u64)> {
    let mut hist = new_histogram();
    let (mut ops, mut errors) = (0u64, 0u64);
    // Sequence number (mqkv's correlation; Redis answers in order) and write time of every
    // request in flight, oldest first.
    let mut in_flight: std::collections::VecDeque<(u64, Instant)> =
        std::collections::VecDeque::with_capacity(depth);
    let mut out = BytesMut::new();
    let mut answers: Vec<(u64, bool)> = Vec::new();
    let mut replies: Vec<bool> = Vec::new();
    let mut next_key = 0u64;
    let mut redis_seq = 0u64;
    let mut to_send = depth;
    loop {
        let now = Instant::now();
        if now < end {
            for _ in 0..to_send {
                next_key = (next_key + 1) % PIPELINE_KEYS;
                let seq = match &mut conn {
                    PipeConn::Mqkv(c) => c.queue_set(next_key, &mut out)?,
                    PipeConn::Redis(c) => {
                        c.queue_set(next_key, &mut out);
                        redis_seq += 1;
                        redis_seq
                    }
                };
                in_flight.push_back((seq, now));
            }
            match &mut conn {
                PipeConn::Mqkv(c) => c.send_queued(&out).await?,
                PipeConn::Redis(c) => c.send_queued(&out).await?,
            }
            out.clear();
        }
        if in_flight.is_empty() {
            return Ok((hist, ops, errors));
        }
        answers.clear();
        match &mut conn {
            PipeConn::Mqkv(c) => c.take_set_answers(&mut answers).await?,
            PipeConn::Redis(c) => {
                replies.clear();
                c.take_set_replies(&mut replies).await?;
                answers.extend(replies.iter().map(|ok| (0, *ok)));
            }
        }
        let now = Instant::now();
        for &(seq, ok) in &answers {
            let Some((sent_seq, sent)) = in_flight.pop_front() else {
                bail!("an answer to no request");
            };
            let in_order = seq == 0 || seq == sent_seq;
            if sent >= start && sent < end {
                if ok && in_order {
                    hist.saturating_record((now - sent).as_nanos() as u64);
                    ops += 1;
                } else {
                    errors += 1;
                }
            }
        }
        to_send = answers.len();
    }
}

// ---------------------------------------------------------------------------------------------
// MQTT pub/sub: fan-in and fan-out at QoS 0 and 1.

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
fn reader_failures(readers: &mut JoinSet<Result<()>>, r: &mut RunResult) {
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

// ---------------------------------------------------------------------------------------------
// Notification fan-out: one key, many observers; or, with pattern watches, many keys (the
// setter goes round them) and every observer watching them all through one pattern.

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

// ---------------------------------------------------------------------------------------------
// Connection storm: connect, CONNECT, CONNACK, DISCONNECT, close, again.

struct Storm {
    addr: SocketAddr,
    idx: usize,
    buf: BytesMut,
}

fn reset_on_close(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setting a socket option on a descriptor owned by `stream`, with a valid struct.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Opens a connection and completes the MQTT handshake, keeping buffers small.
async fn handshake(addr: SocketAddr, client_id: &str, buf: &mut BytesMut) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut out = BytesMut::with_capacity(64);
    connect_packet(client_id).encode(&mut out, mqkv_broker::codec::V5);
    stream.write_all(&out).await?;
    buf.clear();
    loop {
        if let Some(frame) = split_frame(buf)? {
            crate::mqtt::check_connack(&frame)?;
            return Ok(stream);
        }
        if stream.read_buf(buf).await? == 0 {
            bail!("connection closed during the handshake");
        }
    }
}

impl Worker for Storm {
    async fn op(&mut self, seq: u64) -> Result<bool> {
        let id = format!("bench-storm-{}-{seq}", self.idx);
        let mut stream = handshake(self.addr, &id, &mut self.buf).await?;
        stream.write_all(&[0xE0, 0]).await?;
        // Reset rather than linger in TIME_WAIT, so a long storm cannot run out of ports.
        reset_on_close(&stream);
        Ok(true)
    }
}

pub async fn storm(server: &Server, clients: usize, s: &Settings) -> RunResult {
    let mut r = RunResult::new("conn-storm", server.target, clients);
    r.unit = "connects/s".to_owned();
    let workers = (0..clients)
        .map(|idx| Storm {
            addr: server.addr,
            idx,
            buf: BytesMut::with_capacity(256),
        })
        .collect();
    drive(workers, s, server).await.fill(&mut r, 1.0);
    r
}

// ---------------------------------------------------------------------------------------------
// Memory.

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
