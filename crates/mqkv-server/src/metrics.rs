//! `/metrics`: the Prometheus text format, with the AIO broker's metric names wherever one
//! exists (so AIO's dashboards and alerts work) and mqkv's own beside them.

use std::fmt::Write;

use mqkv_broker::Broker;
use mqkv_raft::StoreNode;

use crate::statestore::counters::{StoreCounters, BUCKETS_US, COMMANDS};

/// What `/metrics` reads.
pub struct Sources {
    pub broker: Broker,
    pub node: StoreNode,
    pub counters: std::sync::Arc<StoreCounters>,
    /// The `hostname` label every metric carries, as AIO's do.
    pub hostname: String,
    /// The queue policy, for the label of queue drops.
    pub queue_full: &'static str,
    /// The files read again on SIGHUP or when they change.
    pub reloader: std::sync::Arc<crate::reload::Reloader>,
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Escapes a label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Out {
    text: String,
    host: String,
}

impl Out {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let _ = write!(self.text, "{name}{{hostname=\"{}\"", self.host);
        for (k, v) in labels {
            let _ = write!(self.text, ",{k}=\"{}\"", label(v));
        }
        let _ = writeln!(self.text, "}} {value}");
    }

    /// The samples of one histogram: `cumulative` holds a count per bound of `bounds_us` (in
    /// microseconds), then the total.
    fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        bounds_us: &[u64],
        cumulative: &[u64],
        sum_us: u64,
    ) {
        for (bound, count) in bounds_us.iter().zip(cumulative) {
            let le = format!("{}", *bound as f64 / 1e6);
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&format!("{name}_bucket"), &with_le, count);
        }
        let total = cumulative.last().copied().unwrap_or(0);
        let mut with_le = labels.to_vec();
        with_le.push(("le", "+Inf"));
        self.sample(&format!("{name}_bucket"), &with_le, total);
        self.sample(&format!("{name}_sum"), labels, sum_us as f64 / 1e6);
        self.sample(&format!("{name}_count"), labels, total);
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.header(name, kind, help);
        self.sample(name, &[], value);
    }
}

/// The whole `/metrics` page.
pub fn render(s: &Sources) -> String {
    let mut o = Out {
        text: String::with_capacity(16 * 1024),
        host: label(&s.hostname),
    };
    let b = s.broker.stats();
    let c = &s.counters;

    // The state store, by AIO's names: requests received, errors included.
    let store = [
        (
            "insertions",
            "SET requests that created their key (refused ones: of a key that did not exist)",
            c.total(|x| &x.insertions),
        ),
        (
            "modifications",
            "SET requests of a key that existed, applied or refused",
            c.total(|x| &x.modifications),
        ),
        (
            "deletions",
            "DEL and VDEL requests",
            c.total(|x| &x.deletions),
        ),
        ("retrievals", "GET requests", c.total(|x| &x.retrievals)),
        (
            "keynotify_requests",
            "KEYNOTIFY requests",
            c.total(|x| &x.keynotify_requests),
        ),
        (
            "notifications_sent",
            "key change notifications sent",
            c.total(|x| &x.notifications_sent),
        ),
    ];
    for (name, help, value) in store {
        o.one(
            &format!("aio_broker_state_store_{name}"),
            "counter",
            help,
            value,
        );
    }

    // The broker, by AIO's names. Traffic per metric category: the `metriccategory` user
    // property of the client's CONNECT.
    let traffic = [
        (
            "aio_broker_publishes_received",
            "PUBLISH packets received from clients",
        ),
        (
            "aio_broker_payload_bytes_received",
            "payload bytes of PUBLISH packets received",
        ),
        (
            "aio_broker_publishes_sent",
            "PUBLISH packets sent to clients",
        ),
        (
            "aio_broker_payload_bytes_sent",
            "payload bytes of PUBLISH packets sent",
        ),
    ];
    for (i, (name, help)) in traffic.into_iter().enumerate() {
        o.header(name, "counter", help);
        for (category, figures) in &b.by_category {
            o.sample(name, &[("category", category)], figures[i]);
        }
    }
    o.header(
        "aio_broker_qos0_messages_dropped",
        "counter",
        "QoS 0 messages dropped on their way to a disconnected or full session",
    );
    o.sample(
        "aio_broker_qos0_messages_dropped",
        &[("direction", "outgoing")],
        b.qos0_dropped,
    );
    let broker = [
        (
            "aio_broker_connected_sessions",
            "gauge",
            "sessions with a connection",
            b.connected_sessions,
        ),
        (
            "aio_broker_total_sessions",
            "gauge",
            "sessions, connected or kept for a disconnected client",
            b.total_sessions,
        ),
        (
            "aio_broker_total_subscriptions",
            "gauge",
            "subscriptions of every session",
            b.total_subscriptions,
        ),
        (
            "aio_broker_store_retained_messages",
            "gauge",
            "retained messages",
            b.retained_messages,
        ),
        (
            "aio_broker_store_retained_bytes",
            "gauge",
            "topic and payload bytes of the retained messages",
            b.retained_bytes,
        ),
        (
            "aio_broker_authentication_successes",
            "counter",
            "connections authenticated",
            b.authentication_successes,
        ),
        (
            "aio_broker_authentication_failures",
            "counter",
            "connections refused by authentication",
            b.authentication_failures,
        ),
        (
            "aio_broker_authorization_allow",
            "counter",
            "operations a policy allowed",
            b.authorization_allow,
        ),
        (
            "aio_broker_authorization_deny",
            "counter",
            "operations refused by the policy or a namespace reserved for the server",
            b.authorization_deny,
        ),
    ];
    for (name, kind, help, value) in broker {
        o.one(name, kind, help, value);
    }

    // mqkv's own.
    let (queued, budget) = s.broker.queued_bytes();
    o.one(
        "mqkv_queued_bytes",
        "gauge",
        "bytes of the messages waiting in every session queue",
        queued,
    );
    o.one(
        "mqkv_queued_bytes_limit",
        "gauge",
        "the most bytes every session queue together may hold (0: no limit)",
        budget,
    );
    o.header(
        "mqkv_connections",
        "gauge",
        "open connections by listener kind",
    );
    for (kind, n) in &b.connections {
        o.sample("mqkv_connections", &[("kind", kind)], n);
    }
    let name = "mqkv_handshake_failures";
    o.header(
        name,
        "counter",
        "connections ended before MQTT began: TLS handshake failed, WebSocket upgrade or PROXY protocol header refused, or handshakes not finished in time",
    );
    for (reason, n) in &b.handshake_failures {
        o.sample(name, &[("reason", reason)], n);
    }
    o.header(
        "mqkv_queue_dropped_messages",
        "counter",
        "messages dropped by full session queues, by the queue policy",
    );
    o.sample(
        "mqkv_queue_dropped_messages",
        &[("policy", s.queue_full)],
        b.queue_full_dropped,
    );
    o.one(
        "mqkv_state_store_scans",
        "counter",
        "SCAN requests",
        c.total(|x| &x.scans),
    );
    o.one(
        "mqkv_state_store_not_authorized",
        "counter",
        "state store requests refused by the policy",
        c.total(|x| &x.not_authorized),
    );

    let name = "mqkv_state_store_request_duration_seconds";
    o.header(
        name,
        "histogram",
        "time from a state store request's arrival to its answer, by command",
    );
    for (i, command) in COMMANDS.iter().enumerate() {
        let h = c.latency(i);
        o.histogram(
            name,
            &[("command", command)],
            &BUCKETS_US,
            &h.cumulative,
            h.sum_us,
        );
    }

    let (keys, bytes, limits) = s
        .node
        .read(|m| (m.len() as u64, m.stored_bytes(), m.limits()));
    o.one("mqkv_state_store_keys", "gauge", "keys stored", keys);
    o.one(
        "mqkv_state_store_bytes",
        "gauge",
        "bytes of keys and values stored",
        bytes,
    );
    if let Some(max) = limits.max_keys {
        o.one("mqkv_state_store_max_keys", "gauge", "the key quota", max);
    }
    if let Some(max) = limits.max_bytes {
        o.one("mqkv_state_store_max_bytes", "gauge", "the byte quota", max);
    }

    let raft = s.node.raft_figures();
    let stats = s.node.stats();
    let node = s.node.node_id().to_string();
    let node_label = [("node", node.as_str())];
    let raft_gauges = [
        ("mqkv_raft_term", "the current raft term", raft.term),
        (
            "mqkv_raft_leader",
            "the leader's node id (0: none known)",
            raft.leader.unwrap_or(0),
        ),
        (
            "mqkv_raft_is_leader",
            "1 while this node leads",
            u64::from(raft.is_leader),
        ),
        (
            "mqkv_raft_last_log_index",
            "index of the last entry in this node's log",
            raft.last_log_index.unwrap_or(0),
        ),
        (
            "mqkv_raft_commit_index",
            "index of the last entry this node knows is committed",
            raft.commit_index.unwrap_or(0),
        ),
        (
            "mqkv_raft_applied_index",
            "index of the last entry this node applied",
            raft.applied_index.unwrap_or(0),
        ),
    ];
    for (name, help, value) in raft_gauges {
        o.header(name, "gauge", help);
        o.sample(name, &node_label, value);
    }
    o.one(
        "mqkv_log_commits",
        "counter",
        "durable commits (syncs) of the log; log entries written over this is the batch size",
        stats.log_commits,
    );
    o.one(
        "mqkv_log_entries_written",
        "counter",
        "log entries written",
        stats.log_entries_written,
    );
    let name = "mqkv_log_write_duration_seconds";
    o.header(
        name,
        "histogram",
        "durable log appends: the write and sync of one batch of log entries",
    );
    let cumulative: Vec<u64> = stats
        .log_write_buckets
        .iter()
        .scan(0, |running, n| {
            *running += n;
            Some(*running)
        })
        .collect();
    o.histogram(
        name,
        &[],
        &mqkv_raft::LOG_WRITE_BUCKETS_US,
        &cumulative,
        stats.log_write_us,
    );
    o.one(
        "mqkv_snapshots_built",
        "counter",
        "snapshots written",
        stats.snapshots_built,
    );
    reloads(&mut o, &s.reloader.report());
    o.text
}

/// The files the server reads again on SIGHUP or when they change: whether each part loaded,
/// and when the server certificates expire.
fn reloads(o: &mut Out, parts: &[crate::reload::PartReport]) {
    let name = "mqkv_reload_successful";
    o.header(
        name,
        "gauge",
        "1 if the part's files loaded the last time they were read, 0 if the part still runs on older ones",
    );
    for p in parts {
        let file = p.file.to_string_lossy();
        o.sample(
            name,
            &[("part", p.part.name()), ("file", &file)],
            u8::from(p.ok),
        );
    }
    let name = "mqkv_reload_failures";
    o.header(name, "counter", "reads of the part's files that failed");
    for p in parts {
        let file = p.file.to_string_lossy();
        o.sample(
            name,
            &[("part", p.part.name()), ("file", &file)],
            p.failures,
        );
    }
    let name = "mqkv_tls_certificate_not_after_seconds";
    o.header(
        name,
        "gauge",
        "when the server certificate in use expires, in seconds since the Unix epoch",
    );
    for p in parts {
        if let Some(t) = p.not_after {
            o.sample(name, &[("file", &p.file.to_string_lossy())], t);
        }
    }
}
