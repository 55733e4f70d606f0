//! Saving the broker's retained messages and persistent sessions in the data directory.
//!
//! `broker.redb` holds each retained message under its topic, and the persistent sessions as
//! one snapshot. On an interval the saver writes the retained messages that changed since the
//! last save and, when any session changed, the sessions; once more at graceful shutdown. Each
//! save is one fsynced redb transaction, so a crash leaves either the previous save or the new
//! one, never a mix. The loss window after a crash (`kill -9`, power loss) is therefore at most
//! one interval of changes to retained messages, subscriptions, and queued or in-flight
//! messages; a graceful shutdown loses nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mqkv_broker::persist::{BrokerState, StoredMessage};
use mqkv_broker::{Broker, RetainedChanges};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("broker_state");
const RETAINED: TableDefinition<&str, &[u8]> = TableDefinition::new("retained");
const META: TableDefinition<&str, u32> = TableDefinition::new("meta");
const STATE_KEY: &str = "state";
const FORMAT_KEY: &str = "format_version";

/// Layout of the file: 1 kept the retained messages inside the sessions' snapshot; 2 keeps
/// them in a table of their own. Both are read; 2 is written.
const FILE_FORMAT: u32 = 2;

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
    #[error("{path} has format version {found}; this mqkv reads versions 1 to {expected}")]
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

/// What was saved, as read at start.
pub struct Loaded {
    pub state: BrokerState,
    /// Whether the retained messages were read from their own table, where they stay as they
    /// are; otherwise the first save writes them all there.
    pub retained_in_place: bool,
}

/// The open broker state file.
pub struct BrokerStore {
    db: Database,
    path: PathBuf,
}

impl BrokerStore {
    /// Opens or creates `broker.redb` in `dir` and returns it with the saved state, if any.
    pub fn open(dir: &Path) -> Result<(BrokerStore, Option<Loaded>), PersistError> {
        let path = dir.join(BROKER_FILE);
        std::fs::create_dir_all(dir).map_err(|e| PersistError::Open {
            path: dir.to_owned(),
            message: e.to_string(),
        })?;
        // The file is read once, at start, and then only written: a page cache would only keep
        // a copy of what was last written (redb's default allows 1 GiB).
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

    fn load(&self) -> Result<Option<Loaded>, PersistError> {
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
        let format = match format {
            None => return Ok(None),
            Some(f) if !(1..=FILE_FORMAT).contains(&f) => {
                return Err(PersistError::Format {
                    path: self.path.clone(),
                    found: f,
                    expected: FILE_FORMAT,
                })
            }
            Some(f) => f,
        };
        let mut state = match txn.open_table(STATE) {
            Ok(table) => match table.get(STATE_KEY).map_err(|e| self.corrupt(e))? {
                Some(bytes) => postcard::from_bytes(bytes.value()).map_err(|e| self.corrupt(e))?,
                None => BrokerState::default(),
            },
            Err(redb::TableError::TableDoesNotExist(_)) => BrokerState::default(),
            Err(e) => return Err(self.corrupt(e)),
        };
        state.format = mqkv_broker::persist::BROKER_STATE_FORMAT;
        if format >= 2 {
            match txn.open_table(RETAINED) {
                Ok(table) => {
                    for row in table.iter().map_err(|e| self.corrupt(e))? {
                        let (_, bytes) = row.map_err(|e| self.corrupt(e))?;
                        let m: StoredMessage =
                            postcard::from_bytes(bytes.value()).map_err(|e| self.corrupt(e))?;
                        let index = u32::try_from(state.messages.len())
                            .map_err(|_| self.corrupt("too many messages"))?;
                        state.messages.push(m);
                        state.retained.push(index);
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(self.corrupt(e)),
            }
        }
        Ok(Some(Loaded {
            state,
            retained_in_place: format >= 2,
        }))
    }

    /// Writes `sessions`, if given, and the retained messages that changed, durably in one
    /// transaction.
    pub fn save(
        &self,
        sessions: Option<&BrokerState>,
        retained: &RetainedChanges,
    ) -> Result<(), PersistError> {
        let write_err = |e: &dyn std::fmt::Display| PersistError::Write {
            path: self.path.clone(),
            message: e.to_string(),
        };
        let txn = self.db.begin_write().map_err(|e| write_err(&e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| write_err(&e))?;
            meta.insert(FORMAT_KEY, FILE_FORMAT)
                .map_err(|e| write_err(&e))?;
            if let Some(state) = sessions {
                // Exactly as large as the serialized state: growing a vector as it fills would
                // hold up to twice that at the moment it moves.
                let size =
                    postcard::experimental::serialized_size(state).map_err(|e| write_err(&e))?;
                let bytes = postcard::to_extend(state, Vec::with_capacity(size))
                    .map_err(|e| write_err(&e))?;
                let mut table = txn.open_table(STATE).map_err(|e| write_err(&e))?;
                table
                    .insert(STATE_KEY, bytes.as_slice())
                    .map_err(|e| write_err(&e))?;
            }
            if let RetainedChanges::All(_) = retained {
                txn.delete_table(RETAINED).map_err(|e| write_err(&e))?;
            }
            let mut table = txn.open_table(RETAINED).map_err(|e| write_err(&e))?;
            let entries: Box<dyn Iterator<Item = (&str, Option<&Arc<mqkv_broker::Message>>)>> =
                match retained {
                    RetainedChanges::All(messages) => {
                        Box::new(messages.iter().map(|m| (m.topic.as_str(), Some(m))))
                    }
                    RetainedChanges::Topics(topics) => {
                        Box::new(topics.iter().map(|(t, m)| (t.as_str(), m.as_ref())))
                    }
                };
            // One buffer for every message, each written at once.
            let mut buf = Vec::new();
            for (topic, message) in entries {
                match message {
                    Some(m) => {
                        buf.clear();
                        buf = postcard::to_extend(&StoredMessage::of(m), std::mem::take(&mut buf))
                            .map_err(|e| write_err(&e))?;
                        table.insert(topic, buf.as_slice())
                    }
                    None => table.remove(topic),
                }
                .map_err(|e| write_err(&e))?;
            }
        }
        txn.commit().map_err(|e| write_err(&e))
    }
}

/// Saves the broker state every `interval` while it changes. Returns a handle whose `finish`
/// writes the last changes.
pub struct Saver {
    stop: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<Result<(), PersistError>>,
}

/// Saves what changed since `saved`, the sessions' change counter at the last save (`None`:
/// the sessions are written whatever it says); returns the counter saved, or what failed.
/// Retained changes that fail to be written are counted as all changed again.
async fn save_changes(
    store: &Arc<BrokerStore>,
    broker: &Broker,
    saved: Option<u64>,
) -> Result<u64, PersistError> {
    let now = broker.session_changes();
    let retained = broker.take_retained_changes();
    let replace = matches!(retained, RetainedChanges::All(_));
    if saved == Some(now) && retained.is_empty() {
        return Ok(now);
    }
    // Replacing the retained messages rewrites the sessions too: files of format 1 hold
    // retained messages among them.
    let sessions = (saved != Some(now) || replace).then(|| broker.export_sessions());
    let store = store.clone();
    // The saving thread goes quiet afterwards: it gives back what the serialized state
    // took at once.
    let save = move || {
        let saved = store.save(sessions.as_ref(), &retained);
        drop((sessions, retained));
        mqkv_broker::release_freed_memory();
        saved
    };
    let outcome = tokio::task::spawn_blocking(save).await.unwrap_or_else(|e| {
        Err(PersistError::Write {
            path: PathBuf::from(BROKER_FILE),
            message: format!("the saving thread failed: {e}"),
        })
    });
    match outcome {
        Ok(()) => Ok(now),
        Err(e) => {
            broker.retained_changes_lost();
            Err(e)
        }
    }
}

impl Saver {
    pub fn start(store: BrokerStore, broker: Broker, interval: Duration) -> Saver {
        let store = Arc::new(store);
        let stop = Arc::new(tokio::sync::Notify::new());
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut saved = broker.session_changes();
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = stop.notified() => break,
                    }
                    match save_changes(&store, &broker, Some(saved)).await {
                        Ok(now) => saved = now,
                        Err(e) => tracing::error!(error = %e, "saving broker state failed"),
                    }
                }
                // No save is under way: the last one writes everything that is not saved yet.
                save_changes(&store, &broker, None).await.map(|_| ())
            })
        };
        Saver { stop, task }
    }

    /// Writes the last changes and stops.
    pub async fn finish(self) -> Result<(), PersistError> {
        self.stop.notify_one();
        self.task.await.map_err(|e| PersistError::Write {
            path: PathBuf::from(BROKER_FILE),
            message: e.to_string(),
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mqkv_broker::persist::{StoredSession, BROKER_STATE_FORMAT};
    use mqkv_broker::Message;
    use serde::{Deserialize, Serialize};

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mqkv-persist-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn retained(topic: &str, payload: &str) -> Arc<Message> {
        Arc::new(
            StoredMessage {
                topic: topic.into(),
                payload: bytes::Bytes::copy_from_slice(payload.as_bytes()),
                qos: 1,
                retain: true,
                properties: vec![0],
                expires_at_ms: None,
                publisher: None,
            }
            .to_message()
            .expect("a valid message"),
        )
    }

    /// The retained messages loaded, as (topic, payload) in topic order.
    fn retained_of(loaded: &Loaded) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = loaded
            .state
            .retained
            .iter()
            .map(|i| {
                let m = &loaded.state.messages[*i as usize];
                (
                    m.topic.clone(),
                    String::from_utf8_lossy(&m.payload).into_owned(),
                )
            })
            .collect();
        out.sort();
        out
    }

    fn session(client_id: &str) -> StoredSession {
        StoredSession {
            client_id: client_id.into(),
            expiry_interval: 60,
            disconnected_at_ms: None,
            subscriptions: Vec::new(),
            queue: Vec::new(),
            inflight: Vec::new(),
            incoming_qos2: Vec::new(),
            next_packet_id: 1,
            pending_will: None,
        }
    }

    fn pair(topic: &str, payload: &str) -> (String, String) {
        (topic.into(), payload.into())
    }

    #[test]
    fn retained_changes_are_written_one_by_one_and_all_come_back() {
        let dir = temp_dir("changes");
        let (store, loaded) = BrokerStore::open(&dir).expect("opens");
        assert!(loaded.is_none(), "a new file holds nothing");
        let sessions = BrokerState {
            format: BROKER_STATE_FORMAT,
            sessions: vec![session("keeper")],
            ..Default::default()
        };
        let all = RetainedChanges::All(vec![retained("a", "1"), retained("b", "2")]);
        store.save(Some(&sessions), &all).expect("saves");
        let changes = RetainedChanges::Topics(vec![
            ("a".into(), Some(retained("a", "3"))),
            ("b".into(), None),
            ("c".into(), Some(retained("c", "4"))),
            ("d".into(), None),
        ]);
        store.save(None, &changes).expect("saves");
        drop(store);

        let (store, loaded) = BrokerStore::open(&dir).expect("opens again");
        let loaded = loaded.expect("something was saved");
        assert!(loaded.retained_in_place);
        assert_eq!(retained_of(&loaded), vec![pair("a", "3"), pair("c", "4")]);
        assert_eq!(
            loaded.state.sessions, sessions.sessions,
            "the sessions written first"
        );

        let replace = RetainedChanges::All(vec![retained("e", "5")]);
        store.save(None, &replace).expect("saves");
        drop(store);
        let (_, loaded) = BrokerStore::open(&dir).expect("opens again");
        let loaded = loaded.expect("something was saved");
        assert_eq!(retained_of(&loaded), vec![pair("e", "5")], "all replaced");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_kept_retained_messages_among_the_sessions_is_read_and_moved_on() {
        let dir = temp_dir("format1");
        std::fs::create_dir_all(&dir).expect("creates the directory");
        // The first layout: one value with every retained message and session.
        let old = BrokerState {
            format: BROKER_STATE_FORMAT,
            messages: vec![StoredMessage::of(&retained("r", "kept"))],
            retained: vec![0],
            sessions: vec![session("keeper")],
        };
        {
            let db = Database::create(dir.join(BROKER_FILE)).expect("creates");
            let txn = db.begin_write().expect("writes");
            {
                let mut meta = txn.open_table(META).expect("meta");
                meta.insert(FORMAT_KEY, 1).expect("format");
                let mut table = txn.open_table(STATE).expect("state");
                let bytes = postcard::to_allocvec(&old).expect("serializes");
                table.insert(STATE_KEY, bytes.as_slice()).expect("state");
            }
            txn.commit().expect("commits");
        }
        let (store, loaded) = BrokerStore::open(&dir).expect("opens");
        let loaded = loaded.expect("the old state");
        assert!(
            !loaded.retained_in_place,
            "they are to be written to their table"
        );
        assert_eq!(retained_of(&loaded), vec![pair("r", "kept")]);
        assert_eq!(loaded.state.sessions.len(), 1);

        // What the saver writes first after such a load: every retained message, and the
        // sessions without them.
        let sessions = BrokerState {
            format: BROKER_STATE_FORMAT,
            sessions: loaded.state.sessions.clone(),
            ..Default::default()
        };
        let all = RetainedChanges::All(vec![retained("r", "kept")]);
        store.save(Some(&sessions), &all).expect("saves");
        drop(store);
        let (_, loaded) = BrokerStore::open(&dir).expect("opens again");
        let loaded = loaded.expect("the state");
        assert!(loaded.retained_in_place);
        assert_eq!(
            retained_of(&loaded),
            vec![pair("r", "kept")],
            "once, not twice"
        );
        assert_eq!(loaded.state.sessions.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_newer_format_is_refused() {
        let dir = temp_dir("newer");
        std::fs::create_dir_all(&dir).expect("creates the directory");
        {
            let db = Database::create(dir.join(BROKER_FILE)).expect("creates");
            let txn = db.begin_write().expect("writes");
            txn.open_table(META)
                .expect("meta")
                .insert(FORMAT_KEY, FILE_FORMAT + 1)
                .expect("format");
            txn.commit().expect("commits");
        }
        let err = BrokerStore::open(&dir).err().expect("refused");
        assert!(matches!(err, PersistError::Format { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

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
