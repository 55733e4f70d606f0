//! Server configuration: a TOML file, overridden by command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mqkv_broker::BrokerConfig;
use serde::{Deserialize, Serialize};

/// Where the state store keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum StorageKind {
    /// In memory only: everything is gone when the process ends.
    Memory,
    /// In the data directory: survives restarts and crashes.
    #[default]
    Disk,
}

/// Which thread the state store's raft (its log and state machine) runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RaftThread {
    /// `shared` when the connection threads are pinned one to every CPU the process may use
    /// (so a thread of raft's own would have no CPU to itself), `own` otherwise.
    #[default]
    Auto,
    /// A thread of its own.
    Own,
    /// The last connection thread, beside its connections; with disk storage the log's syncs
    /// run on a thread of their own.
    Shared,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateStoreConfig {
    /// Largest number of keys; `None` is unlimited.
    pub max_keys: Option<u64>,
    /// Largest total of key and value bytes; `None` is unlimited.
    pub max_bytes: Option<u64>,
    /// Keys per SCAN page.
    pub scan_page_size: usize,
    /// Node id in the versions (HLCs) the store hands out.
    pub node_id: String,
    /// With disk storage, a snapshot of the state is written once the log written since the
    /// last one outgrows both this many bytes and that snapshot. Larger: fewer snapshots
    /// (with large values, less written to disk), a longer log to replay at a restart.
    pub snapshot_log_bytes: u64,
}

impl Default for StateStoreConfig {
    fn default() -> Self {
        StateStoreConfig {
            max_keys: None,
            max_bytes: None,
            scan_page_size: 100,
            node_id: "mqkv".into(),
            snapshot_log_bytes: mqkv_raft::NodeOptions::default().snapshot_log_bytes,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// MQTT listeners.
    pub listen: Vec<SocketAddr>,
    pub data_dir: PathBuf,
    pub storage: StorageKind,
    pub broker: BrokerConfig,
    pub state_store: StateStoreConfig,
    /// How often changed broker state (retained messages, persistent sessions) is saved, in
    /// milliseconds; the most a crash can lose of it.
    pub persist_interval_ms: u64,
    /// Threads serving client connections; `None` is one per core. The state store's log
    /// is written and applied on one of them or on a thread of its own (see `raft_thread`).
    pub workers: Option<usize>,
    /// Pins each connection thread to a CPU of its own (when there are no more of them than
    /// CPUs the process may use); on unless told otherwise, whatever the storage. Unpinned, a
    /// scheduler that packs runnable threads onto few CPUs runs both connection threads on one
    /// CPU at times, each waiting out the other's time slice (GET at 64 clients: a p99 of 4.3
    /// ms instead of 1.5 ms in about half the runs), and with disk storage it leaves the CPU
    /// of the log's thread idle while the connection threads queue on the other. Rounds 17 and
    /// 23 of `docs/bench/changes.md` measure both ways.
    pub pin_workers: bool,
    /// Runs the connection threads under the kernel's batch scheduling policy (`SCHED_BATCH`,
    /// Linux; on unless told otherwise): a connection thread woken by a packet or a completed
    /// log write does not preempt the thread running on its CPU, so clients sharing the CPU
    /// send more before it runs and each of its passes finds more to do (round 36 of
    /// `docs/bench/changes.md`). On a CPU busy with other programs, a woken connection thread
    /// waits out their time slice before it answers.
    pub batch_scheduling: bool,
    /// Where the state store's raft runs (see [`RaftThread`]). Sharing a connection thread
    /// saves the thread hand-offs of every write for that thread's half of the clients, and
    /// with disk storage keeps serving them while the disk syncs (durable SET at 64 clients on
    /// two CPUs: round 25 of `docs/bench/changes.md`).
    pub raft_thread: RaftThread,
    /// With disk storage and raft on a connection thread, the log's appends are written with
    /// direct I/O through io_uring (`O_DIRECT` with `RWF_DSYNC`: durable once done, no copy
    /// into the page cache, no sync thread to wake), where the system allows it, and through
    /// the page cache with an `fdatasync` on a sync thread otherwise or when this is off
    /// (round 27 of `docs/bench/changes.md`).
    pub direct_log_writes: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 1883))],
            data_dir: PathBuf::from("./mqkv-data"),
            storage: StorageKind::default(),
            broker: BrokerConfig::default(),
            state_store: StateStoreConfig::default(),
            persist_interval_ms: 1000,
            workers: None,
            pin_workers: true,
            batch_scheduling: true,
            raft_thread: RaftThread::Auto,
            direct_log_writes: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid configuration in {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
}

impl ServerConfig {
    pub fn from_file(path: &Path) -> Result<ServerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_file() {
        let c: ServerConfig = toml::from_str(
            r#"
            listen = ["127.0.0.1:1884", "[::1]:1885"]
            storage = "memory"
            workers = 3
            pin_workers = false
            batch_scheduling = false
            raft_thread = "shared"
            direct_log_writes = false
            [broker]
            max_packet_size = 1024
            max_queued_messages = 5
            queue_full = "drop-oldest"
            co_locate = false
            [[broker.users]]
            username = "u"
            password = "p"
            [state_store]
            max_keys = 10
            "#,
        )
        .expect("valid");
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.broker.max_packet_size, 1024);
        assert_eq!(
            c.broker.queue_full,
            mqkv_broker::QueueFullPolicy::DropOldest
        );
        assert_eq!(c.state_store.max_keys, Some(10));
        assert_eq!(c.broker.users.len(), 1);
        assert!(!c.broker.co_locate);
        assert!(
            ServerConfig::default().broker.co_locate,
            "on unless told otherwise"
        );
        assert_eq!(c.workers, Some(3));
        assert!(!c.pin_workers, "memory storage, told not to pin");
        assert!(!c.batch_scheduling);
        assert!(
            ServerConfig::default().batch_scheduling,
            "on unless told otherwise"
        );
        assert_eq!(c.raft_thread, RaftThread::Shared);
        assert_eq!(ServerConfig::default().raft_thread, RaftThread::Auto);
        assert!(!c.direct_log_writes);
        assert!(
            ServerConfig::default().direct_log_writes,
            "on unless told otherwise"
        );
        for (text, kind) in [("own", RaftThread::Own), ("auto", RaftThread::Auto)] {
            let c: ServerConfig =
                toml::from_str(&format!("raft_thread = \"{text}\"")).expect("valid");
            assert_eq!(c.raft_thread, kind);
        }
        assert!(toml::from_str::<ServerConfig>(r#"raft_thread = "sometimes""#).is_err());
        let disk = ServerConfig::default();
        assert_eq!(disk.storage, StorageKind::Disk);
        assert!(disk.pin_workers, "disk storage pins unless told otherwise");
        let memory: ServerConfig = toml::from_str(r#"storage = "memory""#).expect("valid");
        assert!(
            memory.pin_workers,
            "memory storage pins unless told otherwise"
        );
    }

    #[test]
    fn the_readme_example_is_valid() {
        let readme = include_str!("../../../README.md");
        let block = readme
            .split("```toml")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("a toml block in the README");
        let c: ServerConfig = toml::from_str(block).expect("the README example parses");
        assert_eq!(c.storage, StorageKind::Disk);
        assert_eq!(c.broker.users.len(), 1);
    }

    #[test]
    fn rejects_unknown_keys() {
        assert!(toml::from_str::<ServerConfig>("listn = []").is_err());
    }
}
