//! Broker settings: limits, queues, authentication defaults.

use serde::{Deserialize, Serialize};

/// What a session does when its queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum QueueFullPolicy {
    /// Keep what is queued and drop the message that does not fit.
    #[default]
    DropNew,
    /// Drop the oldest queued message to make room.
    DropOldest,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Largest packet accepted from clients, in bytes (advertised as Maximum Packet Size).
    pub max_packet_size: u32,
    /// How many unacknowledged QoS 2 publishes a client may have open towards the broker.
    pub receive_maximum: u16,
    /// Topic aliases a client may use towards the broker.
    pub topic_alias_maximum: u16,
    /// Largest keep alive the broker accepts, in seconds; larger or zero requests get this value
    /// as Server Keep Alive. `0` accepts whatever the client asks.
    pub max_keep_alive: u16,
    /// Largest session expiry interval granted, in seconds.
    pub max_session_expiry: u32,
    /// Messages queued per session (online or offline) before `queue_full` applies.
    pub max_queued_messages: usize,
    /// Bytes (topics and payloads, and 64 per message) every session queue together may hold
    /// before `queue_full` applies; 0: no limit.
    pub max_queued_bytes: u64,
    pub queue_full: QueueFullPolicy,
    /// Anonymous clients: `None` allows them on loopback listeners only.
    pub allow_anonymous: Option<bool>,
    /// Static user name / password pairs accepted by the default authenticator.
    pub users: Vec<UserConfig>,
    /// Threads that serve client connections, each with a runtime of its own; 0 is one per
    /// core. Set by the server from its `workers` setting, not read from the broker section.
    #[serde(skip)]
    pub connection_threads: usize,
    /// Pins connection thread `i` to the `i`-th CPU the process may run on, when there are no
    /// more threads than such CPUs. Set by the server from its `pin_workers` setting.
    #[serde(skip)]
    pub pin_connection_threads: bool,
    /// Runs the connection threads under the kernel's batch scheduling policy (`SCHED_BATCH`,
    /// Linux): a woken connection thread does not preempt the thread running on its CPU. Set
    /// by the server from its `batch_scheduling` setting.
    #[serde(skip)]
    pub batch_connection_threads: bool,
    /// Moves a connection to the connection thread whose publishers send it (nearly) all its
    /// messages, so a publish and its deliveries are handled on one thread (see
    /// the broker's `threads` module).
    pub co_locate: bool,
    /// Longest a packet may take to arrive once its first byte has, in seconds (whatever the
    /// keep alive): a connection whose packet stops arriving midway is closed with DISCONNECT
    /// 0x8D. 0 waits for ever.
    pub packet_timeout_secs: u32,
    /// Most retained messages kept; a retained publish beyond it is refused (PUBACK or
    /// PUBREC 0x97, Quota exceeded; dropped at QoS 0).
    pub max_retained_messages: usize,
    /// Most bytes of retained messages (topics and payloads) kept, refused beyond as above.
    pub max_retained_bytes: u64,
    /// Most sessions, connected or kept for a disconnected client; a client that would start
    /// one more gets CONNACK 0x97 (Quota exceeded).
    pub max_sessions: usize,
    /// Most connections open at once from one IP address (counted from the moment they are
    /// accepted); one more gets CONNACK 0x97 (Quota exceeded). 0: no limit.
    pub max_connections_per_address: u32,
    /// The SUBACK reason code of a subscription the policy refuses: 0x87 (Not authorized), or
    /// 0x80 (Unspecified error) for clients that expect it.
    pub subscription_denied_reason: u8,
}

impl BrokerConfig {
    /// How many connection threads to start.
    pub(crate) fn threads(&self) -> usize {
        match self.connection_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub username: String,
    pub password: String,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_packet_size: 16 * 1024 * 1024,
            receive_maximum: 1024,
            topic_alias_maximum: 64,
            max_keep_alive: 0,
            max_session_expiry: u32::MAX,
            max_queued_messages: 10_000,
            max_queued_bytes: 256 * 1024 * 1024,
            queue_full: QueueFullPolicy::DropNew,
            allow_anonymous: None,
            users: Vec::new(),
            connection_threads: 0,
            pin_connection_threads: false,
            batch_connection_threads: false,
            co_locate: true,
            packet_timeout_secs: 60,
            max_retained_messages: 100_000,
            max_retained_bytes: 256 * 1024 * 1024,
            max_sessions: 100_000,
            max_connections_per_address: 0,
            subscription_denied_reason: crate::codec::reason::NOT_AUTHORIZED,
        }
    }
}
