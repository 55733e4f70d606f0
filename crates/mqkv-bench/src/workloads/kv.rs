//! State store: SET, GET, 90/10 mix.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::task::JoinSet;

use super::{connect_all, drive, Outcome, Settings, Worker, OP_TIMEOUT, SETUP_TIMEOUT};
use crate::mqtt::within;
use crate::report::{new_histogram, RunResult};
use crate::servers::{self_cpu_seconds, Server, Target};
use crate::store::{RedisClient, StoreClient};

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

pub(super) enum KvConn {
    Mqkv(StoreClient),
    Redis(RedisClient),
}

impl KvConn {
    pub(super) async fn set(&mut self, key: u64) -> Result<bool> {
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

pub(super) async fn kv_connect(
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
