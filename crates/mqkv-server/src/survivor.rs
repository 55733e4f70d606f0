//! When a node dies, the others finish what its clients left: the leader publishes the wills of
//! the connections the dead node held, after their will delay, and ends their sessions after
//! their expiry interval, as the dead node would have.
//!
//! A node is taken for dead when the leader has not heard from it for [`DEAD_AFTER`] (every
//! node sends its routes each second). Delays count from then. A will is removed from the log
//! before it is published, so it is published at most once: a leader that dies in between
//! loses it. A node that was only cut off, not dead, keeps its clients; their wills may then
//! have been published by the others meanwhile.

use std::collections::HashMap;
use std::sync::Weak;
use std::time::{Duration, Instant};

use mqkv_broker::replicated::SessionRecord;
use mqkv_broker::Message;
use mqkv_raft::NodeId;
use mqkv_store::{MetaChange, StateMachine};

use crate::replicated::{key, name, KeptWill, Owner, ReplicatedBroker, OWNER, SESSION, WILL};

/// Silence after which the leader takes a node for dead.
pub const DEAD_AFTER: Duration = Duration::from_secs(5);

/// How often the leader looks.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Runs on every node; acts while the node leads.
pub(crate) async fn watch(me: Weak<ReplicatedBroker>) {
    let mut dead_since: HashMap<NodeId, Instant> = HashMap::new();
    let mut leading_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let Some(rb) = me.upgrade() else {
            return;
        };
        if !rb.node.is_leader() {
            dead_since.clear();
            leading_since = None;
            continue;
        }
        let now = Instant::now();
        // A new leader gives every node the full time to be heard from.
        let since = *leading_since.get_or_insert(now);
        let peers = rb.node.peer_ids();
        dead_since.retain(|id, _| peers.contains(id));
        for peer in peers {
            let last = rb.last_heard(peer).map_or(since, |t| t.max(since));
            if now.duration_since(last) > DEAD_AFTER {
                dead_since.entry(peer).or_insert(now);
            } else if dead_since.remove(&peer).is_some() {
                tracing::info!(node = peer, "node heard from again");
            }
        }
        if dead_since.is_empty() {
            continue;
        }
        let (changes, wills) = rb.node.read(|m| due(m, &dead_since, now));
        if changes.is_empty() {
            continue;
        }
        match rb.write(changes).await {
            Ok(()) => {
                for will in wills {
                    tracing::info!(
                        topic = will.topic,
                        "publishing the will of a dead node's client"
                    );
                    rb.broker.route_message(will);
                }
            }
            Err(e) => tracing::info!(error = %e, "a dead node's clients not ended yet"),
        }
    }
}

/// The records to remove now that the nodes in `dead` died (each at its instant), and the
/// wills to publish once they are removed.
fn due(
    m: &StateMachine,
    dead: &HashMap<NodeId, Instant>,
    now: Instant,
) -> (Vec<MetaChange>, Vec<Message>) {
    let mut changes = Vec::new();
    let mut wills = Vec::new();
    let owner_of = |client: &str| {
        m.meta(&key(OWNER, client))
            .and_then(|v| postcard::from_bytes::<Owner>(v).ok())
    };
    let expiry_of = |client: &str| {
        m.meta(&key(SESSION, client))
            .and_then(|v| postcard::from_bytes::<SessionRecord>(v).ok())
            .map_or(0, |s| s.expiry_interval)
    };
    let passed = |since: Instant, secs: u32| {
        secs != u32::MAX && since + Duration::from_secs(u64::from(secs)) <= now
    };
    for (k, v) in m.meta_prefixed(WILL) {
        let (Some(client), Ok(kept)) = (name(k, WILL), postcard::from_bytes::<KeptWill>(v)) else {
            continue;
        };
        let Some(since) = dead.get(&kept.owner.node) else {
            continue;
        };
        if owner_of(&client) != Some(kept.owner) {
            // The client connected again elsewhere: that cancels the will.
            changes.push(MetaChange::delete(k.clone()));
            continue;
        }
        if passed(*since, kept.will.delay.min(expiry_of(&client))) {
            changes.push(MetaChange::delete(k.clone()));
            wills.extend(kept.will.message.to_message());
        }
    }
    for (k, v) in m.meta_prefixed(OWNER) {
        let (Some(client), Ok(owner)) = (name(k, OWNER), postcard::from_bytes::<Owner>(v)) else {
            continue;
        };
        let Some(since) = dead.get(&owner.node) else {
            continue;
        };
        if passed(*since, expiry_of(&client)) {
            changes.push(MetaChange::delete(k.clone()));
            changes.push(MetaChange::delete(key(SESSION, &client)));
        }
    }
    (changes, wills)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicated::encode;
    use mqkv_broker::persist::StoredMessage;
    use mqkv_broker::replicated::WillRecord;
    use mqkv_store::{Entry, Op, StoreConfig};

    fn will(topic: &str, delay: u32) -> WillRecord {
        WillRecord {
            message: StoredMessage {
                topic: topic.into(),
                payload: bytes::Bytes::from_static(b"gone"),
                qos: 1,
                retain: false,
                properties: vec![0],
                expires_at_ms: None,
                publisher: Some("c".into()),
            },
            delay,
        }
    }

    fn table(changes: Vec<MetaChange>) -> StateMachine {
        let mut m = StateMachine::new(StoreConfig::new("n"));
        m.apply(&Entry {
            now_ms: 1,
            op: Op::Meta(changes),
        });
        m
    }

    fn put<T: serde::Serialize>(prefix: &[u8], client: &str, value: &T) -> MetaChange {
        MetaChange::put(key(prefix, client), encode(value).expect("encodes"))
    }

    #[test]
    fn wills_and_sessions_of_a_dead_node_end_on_time() {
        let on2 = Owner { node: 2, conn: 7 };
        let on3 = Owner { node: 3, conn: 1 };
        let m = table(vec![
            // At once: no delay, no session kept.
            put(OWNER, "now", &on2),
            put(
                WILL,
                "now",
                &KeptWill {
                    owner: on2,
                    will: will("w/now", 0),
                },
            ),
            // After 10 s; the session after 60 s.
            put(OWNER, "later", &on2),
            put(
                SESSION,
                "later",
                &SessionRecord {
                    expiry_interval: 60,
                    subscriptions: vec![],
                },
            ),
            put(
                WILL,
                "later",
                &KeptWill {
                    owner: on2,
                    will: will("w/later", 10),
                },
            ),
            // Its client moved on to node 3: the will is dropped unpublished.
            put(OWNER, "moved", &on3),
            put(
                WILL,
                "moved",
                &KeptWill {
                    owner: on2,
                    will: will("w/moved", 0),
                },
            ),
        ]);
        let died = Instant::now();
        let dead = HashMap::from([(2, died)]);

        let (changes, wills) = due(&m, &dead, died);
        let topics: Vec<_> = wills.iter().map(|w| w.topic.as_str()).collect();
        assert_eq!(topics, ["w/now"]);
        let removed: Vec<_> = changes
            .iter()
            .map(|c| String::from_utf8_lossy(&c.key).into_owned())
            .collect();
        assert!(removed.contains(&"w/now".to_owned()) && removed.contains(&"o/now".to_owned()));
        assert!(removed.contains(&"w/moved".to_owned()));
        assert!(!removed.iter().any(|k| k.ends_with("later")), "{removed:?}");

        let (_, wills) = due(&m, &dead, died + Duration::from_secs(10));
        assert!(wills.iter().any(|w| w.topic == "w/later"));
        let (changes, _) = due(&m, &dead, died + Duration::from_secs(60));
        assert!(changes.iter().any(|c| &c.key[..] == b"s/later"));
        // Nothing of a node that lives.
        let (changes, wills) = due(
            &m,
            &HashMap::from([(4, died)]),
            died + Duration::from_secs(99),
        );
        assert!(changes.is_empty() && wills.is_empty());
    }
}
