//! Saving the broker's retained messages and persistent sessions, and loading them back
//! (see [`crate::persist`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::codec::{Properties, QoS};
use crate::inner::Inner;
use crate::persist::*;
use crate::session::{Delivery, Inflight, Message, PendingWill, Session};

/// Converts between monotonic instants and wall-clock milliseconds around one fixed point.
#[derive(Clone, Copy)]
struct Clock {
    instant: Instant,
    wall_ms: u64,
}

impl Clock {
    fn now() -> Clock {
        Clock {
            instant: Instant::now(),
            wall_ms: unix_ms(SystemTime::now()),
        }
    }

    fn to_ms(self, t: Instant) -> u64 {
        if t >= self.instant {
            self.wall_ms
                .saturating_add(u64::try_from((t - self.instant).as_millis()).unwrap_or(u64::MAX))
        } else {
            self.wall_ms
                .saturating_sub(u64::try_from((self.instant - t).as_millis()).unwrap_or(u64::MAX))
        }
    }

    fn to_instant(self, ms: u64) -> Instant {
        if ms >= self.wall_ms {
            self.instant + Duration::from_millis(ms - self.wall_ms)
        } else {
            self.instant
                .checked_sub(Duration::from_millis(self.wall_ms - ms))
                .unwrap_or(self.instant)
        }
    }
}

struct Exporter {
    clock: Clock,
    state: BrokerState,
    ids: HashMap<*const Message, u32>,
}

impl Exporter {
    fn message(&mut self, m: &Arc<Message>) -> u32 {
        let key = Arc::as_ptr(m);
        if let Some(id) = self.ids.get(&key) {
            return *id;
        }
        let id = u32::try_from(self.state.messages.len()).unwrap_or(u32::MAX);
        self.state.messages.push(StoredMessage {
            topic: m.topic.clone(),
            payload: m.payload.clone(),
            qos: m.qos as u8,
            retain: m.retain,
            properties: m.properties.to_block(),
            expires_at_ms: m.expires_at.map(|t| self.clock.to_ms(t)),
            publisher: m.publisher.as_deref().map(str::to_owned),
        });
        self.ids.insert(key, id);
        id
    }

    fn delivery(&mut self, d: &Delivery) -> StoredDelivery {
        StoredDelivery {
            message: self.message(&d.message),
            qos: d.qos as u8,
            retain: d.retain,
            subscription_ids: d.subscription_ids.clone(),
        }
    }
}

impl Inner {
    /// Takes a consistent-enough picture of the persistent sessions and the messages they hold
    /// (retained messages are saved on their own, see [`crate::RetainedChanges`]). Each session
    /// is captured under its own lock.
    pub(crate) fn export_sessions(&self) -> BrokerState {
        let mut ex = Exporter {
            clock: Clock::now(),
            state: BrokerState {
                format: BROKER_STATE_FORMAT,
                ..Default::default()
            },
            ids: HashMap::new(),
        };
        let sessions: Vec<Arc<Session>> = self.sessions.lock().values().cloned().collect();
        for s in sessions {
            let st = s.state.lock();
            if st.expiry_interval == 0 {
                continue;
            }
            let subscriptions = st
                .subscriptions
                .iter()
                .map(|(f, (o, id))| StoredSubscription::of(f, o, *id))
                .collect();
            let queue = st.queue.iter().map(|d| ex.delivery(d)).collect();
            let inflight = st
                .inflight
                .iter()
                .map(|(id, inf)| match inf {
                    Inflight::Publish(d) => (*id, Some(ex.delivery(d))),
                    Inflight::Released => (*id, None),
                })
                .collect();
            let pending_will = st
                .pending_will
                .as_ref()
                .map(|w| (ex.message(&w.message), ex.clock.to_ms(w.due)));
            let disconnected_at_ms = Some(
                st.disconnected_at
                    .map_or(ex.clock.wall_ms, |t| ex.clock.to_ms(t)),
            );
            let mut incoming_qos2: Vec<u16> = st.incoming_qos2.iter().copied().collect();
            incoming_qos2.sort_unstable();
            ex.state.sessions.push(StoredSession {
                client_id: s.client_id.to_string(),
                expiry_interval: st.expiry_interval,
                disconnected_at_ms,
                subscriptions,
                queue,
                inflight,
                incoming_qos2,
                next_packet_id: st.next_packet_id,
                pending_will,
            });
        }
        ex.state
    }

    /// Loads saved state into an empty broker (before any listener is bound).
    pub(crate) fn import_state(&self, state: BrokerState) -> Result<(), ImportError> {
        if state.format != BROKER_STATE_FORMAT {
            return Err(ImportError::Format(state.format));
        }
        let clock = Clock::now();
        let mut messages = Vec::with_capacity(state.messages.len());
        for m in state.messages {
            let properties = Properties::from_block(m.properties)
                .map_err(|_| ImportError::Corrupt("message properties"))?;
            messages.push(Arc::new(Message {
                topic: m.topic,
                payload: m.payload,
                qos: QoS::from_u8(m.qos).ok_or(ImportError::Corrupt("message qos"))?,
                retain: m.retain,
                properties,
                expires_at: m.expires_at_ms.map(|ms| clock.to_instant(ms)),
                publisher: m.publisher.map(Arc::from),
            }));
        }
        let get = |i: u32| -> Result<Arc<Message>, ImportError> {
            messages
                .get(i as usize)
                .cloned()
                .ok_or(ImportError::Corrupt("message index"))
        };
        let delivery = |d: StoredDelivery| -> Result<Delivery, ImportError> {
            Ok(Delivery {
                message: get(d.message)?,
                qos: QoS::from_u8(d.qos).ok_or(ImportError::Corrupt("delivery qos"))?,
                retain: d.retain,
                subscription_ids: d.subscription_ids,
            })
        };
        {
            // Read back from disk, each message owns its bytes already: kept without a copy.
            let mut retained = self.retained.write();
            for i in state.retained {
                retained.keep(get(i)?);
            }
        }
        let now = Instant::now();
        for s in state.sessions {
            let client_id: Arc<str> = s.client_id.as_str().into();
            let session = Arc::new(Session::new(client_id.clone()));
            let mut subscriptions = Vec::new();
            for sub in s.subscriptions {
                let options = sub
                    .options()
                    .ok_or(ImportError::Corrupt("subscription qos"))?;
                subscriptions.push((sub.filter, options, sub.identifier));
            }
            {
                let mut st = session.state.lock();
                st.expiry_interval = s.expiry_interval;
                st.disconnected_at =
                    Some(s.disconnected_at_ms.map_or(now, |ms| clock.to_instant(ms)));
                st.queue.use_budget(&self.queue_budget);
                for d in s.queue {
                    st.queue.push_back(delivery(d)?);
                }
                for (id, d) in s.inflight {
                    let inf = match d {
                        Some(d) => Inflight::Publish(delivery(d)?),
                        None => Inflight::Released,
                    };
                    st.inflight.push_back((id, inf));
                }
                st.incoming_qos2 = s.incoming_qos2.into_iter().collect();
                st.next_packet_id = s.next_packet_id.max(1);
                if let Some((m, due)) = s.pending_will {
                    st.pending_will = Some(PendingWill {
                        message: get(m)?,
                        due: clock.to_instant(due),
                    });
                }
            }
            self.sessions.lock().insert(client_id, session.clone());
            for (filter, options, identifier) in subscriptions {
                self.subscribe(&session, &filter, options, identifier);
            }
        }
        Ok(())
    }
}
