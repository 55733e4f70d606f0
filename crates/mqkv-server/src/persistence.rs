//! Saving the broker's retained messages and persistent sessions in the data directory.
//!
//! The state is written as one snapshot to `broker.redb` on an interval (only when something
//! changed) and once more at graceful shutdown. Each save is one fsynced redb transaction, so a
//! crash leaves either the previous snapshot or the new one, never a mix. The loss window after
//! a crash (`kill -9`, power loss) is therefore at most one interval of changes to retained
//! messages, subscriptions, and queued or in-flight messages; a graceful shutdown loses nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mqkv_broker::persist::{BrokerState, BROKER_STATE_FORMAT};
use mqkv_broker::Broker;
use redb::{Database, ReadableDatabase, TableDefinition};

const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("broker_state");
const META: TableDefinition<&str, u32> = TableDefinition::new("meta");
const STATE_KEY: &str = "state";
const FORMAT_KEY: &str = "format_version";

/// File name of the broker state inside the data directory.
pub const BROKER_FILE: &str = "broker.redb";

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error(
        "{path} is in use by another process (is another mqkv running on this data directory?)"
    )]
    InUse { path: PathBuf },
    #[error("cannot open {path}: {message}")]
    Open { path: PathBuf, message: String },
    #[error("{path} has format version {found}; this mqkv reads version {expected}")]
    Format {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("{path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
}

/// redb's page cache for the state file.
const CACHE_BYTES: usize = 4 * 1024 * 1024;

/// The open broker state file.
pub struct BrokerStore {
    db: Database,
    path: PathBuf,
}

impl BrokerStore {
    /// Opens or creates `broker.redb` in `dir` and returns it with the saved state, if any.
    pub fn open(dir: &Path) -> Result<(BrokerStore, Option<BrokerState>), PersistError> {
        let path = dir.join(BROKER_FILE);
        std::fs::create_dir_all(dir).map_err(|e| PersistError::Open {
            path: dir.to_owned(),
            message: e.to_string(),
        })?;
        // The file is read once, at start, and then only written: a page cache would only keep
        // a copy of the last state written (redb's default allows 1 GiB).
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => {
                    PersistError::InUse { path: path.clone() }
                }
                other => PersistError::Corrupt {
                    path: path.clone(),
                    message: other.to_string(),
                },
            })?;
        let store = BrokerStore { db, path };
        let state = store.load()?;
        Ok((store, state))
    }

    fn corrupt(&self, e: impl std::fmt::Display) -> PersistError {
        PersistError::Corrupt {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    fn load(&self) -> Result<Option<BrokerState>, PersistError> {
        let txn = self.db.begin_read().map_err(|e| self.corrupt(e))?;
        let meta = match txn.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(self.corrupt(e)),
        };
        let format = meta
            .get(FORMAT_KEY)
            .map_err(|e| self.corrupt(e))?
            .map(|v| v.value());
        match format {
            None => return Ok(None),
            Some(f) if f != BROKER_STATE_FORMAT => {
                return Err(PersistError::Format {
                    path: self.path.clone(),
                    found: f,
                    expected: BROKER_STATE_FORMAT,
                })
            }
            Some(_) => {}
        }
        let table = txn.open_table(STATE).map_err(|e| self.corrupt(e))?;
        let Some(bytes) = table.get(STATE_KEY).map_err(|e| self.corrupt(e))? else {
            return Ok(None);
        };
        let state: BrokerState =
            postcard::from_bytes(bytes.value()).map_err(|e| self.corrupt(e))?;
        Ok(Some(state))
    }

    /// Writes one snapshot durably.
    pub fn save(&self, state: &BrokerState) -> Result<(), PersistError> {
        let write_err = |e: &dyn std::fmt::Display| PersistError::Write {
            path: self.path.clone(),
            message: e.to_string(),
        };
        // Exactly as large as the serialized state: growing a vector as it fills would hold
        // up to twice that at the moment it moves.
        let size = postcard::experimental::serialized_size(state).map_err(|e| write_err(&e))?;
        let bytes =
            postcard::to_extend(state, Vec::with_capacity(size)).map_err(|e| write_err(&e))?;
        let txn = self.db.begin_write().map_err(|e| write_err(&e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| write_err(&e))?;
            meta.insert(FORMAT_KEY, BROKER_STATE_FORMAT)
                .map_err(|e| write_err(&e))?;
            let mut table = txn.open_table(STATE).map_err(|e| write_err(&e))?;
            table
                .insert(STATE_KEY, bytes.as_slice())
                .map_err(|e| write_err(&e))?;
        }
        txn.commit().map_err(|e| write_err(&e))
    }
}

/// Saves the broker state every `interval` while it changes. Returns a handle whose `finish`
/// writes the final snapshot.
pub struct Saver {
    store: Arc<BrokerStore>,
    broker: Broker,
    task: tokio::task::JoinHandle<()>,
}

impl Saver {
    pub fn start(store: BrokerStore, broker: Broker, interval: Duration) -> Saver {
        let store = Arc::new(store);
        let task = {
            let store = store.clone();
            let broker = broker.clone();
            tokio::spawn(async move {
                let mut saved = broker.changes();
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let now = broker.changes();
                    if now == saved {
                        continue;
                    }
                    let state = broker.export_state();
                    let store = store.clone();
                    // The saving thread goes quiet afterwards: it gives back what the
                    // serialized state took at once.
                    let save = move || {
                        let saved = store.save(&state);
                        drop(state);
                        mqkv_broker::release_freed_memory();
                        saved
                    };
                    match tokio::task::spawn_blocking(save).await {
                        Ok(Ok(())) => saved = now,
                        Ok(Err(e)) => tracing::error!(error = %e, "saving broker state failed"),
                        Err(e) => tracing::error!(error = %e, "saving broker state panicked"),
                    }
                }
            })
        };
        Saver {
            store,
            broker,
            task,
        }
    }

    /// Stops the interval and writes the final snapshot.
    pub async fn finish(self) -> Result<(), PersistError> {
        self.task.abort();
        let state = self.broker.export_state();
        let store = self.store;
        tokio::task::spawn_blocking(move || store.save(&state))
            .await
            .map_err(|e| PersistError::Write {
                path: PathBuf::from(BROKER_FILE),
                message: e.to_string(),
            })?
    }
}

#[cfg(test)]
mod tests {
    use mqkv_broker::persist::StoredMessage;
    use serde::{Deserialize, Serialize};

    /// A stored message as files written before payloads were shared: the payload a `Vec<u8>`.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct OwnedPayload {
        topic: String,
        payload: Vec<u8>,
        qos: u8,
        retain: bool,
        properties: Vec<u8>,
        expires_at_ms: Option<u64>,
        publisher: Option<String>,
    }

    #[test]
    fn a_shared_payload_is_written_and_read_as_an_owned_one_was() {
        let payload: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let shared = StoredMessage {
            topic: "a/b".into(),
            payload: bytes::Bytes::from(payload.clone()),
            qos: 1,
            retain: true,
            properties: vec![0],
            expires_at_ms: Some(7),
            publisher: Some("p".into()),
        };
        let owned = OwnedPayload {
            topic: "a/b".into(),
            payload,
            qos: 1,
            retain: true,
            properties: vec![0],
            expires_at_ms: Some(7),
            publisher: Some("p".into()),
        };
        let written = postcard::to_allocvec(&shared).expect("serializes");
        assert_eq!(written, postcard::to_allocvec(&owned).expect("serializes"));
        let read: StoredMessage = postcard::from_bytes(&written).expect("reads back");
        assert_eq!(read, shared);
        let old: OwnedPayload = postcard::from_bytes(&written).expect("reads as before");
        assert_eq!(old, owned);
    }
}
