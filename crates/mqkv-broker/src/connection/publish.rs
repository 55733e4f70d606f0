//! A client's publishes: checks, routing, the QoS 1 and 2 acknowledgements, and the queue of
//! publishes to in-process services, whose answers and acknowledgements go out in the order
//! the publishes arrived.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::{Conn, Violation};
use crate::codec::{self, reason, QoS};
use crate::service::{Handled, OutboundMessage, Service, ServiceFuture, ServicePublish};
use crate::session::Message;
use crate::topic;

/// A publish to a service, waiting for its work or for earlier answers and acknowledgements.
pub(super) struct Queued {
    work: Work,
    /// PUBACK or PUBREC to send once it is this publish's turn; none at QoS 0.
    ack: Option<PendingAck>,
}

/// A PUBACK or PUBREC still to send: a few bytes where the packet it becomes takes hundreds,
/// so queueing and moving it stays cheap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PendingAck {
    /// PUBREC (QoS 2) rather than PUBACK (QoS 1).
    rec: bool,
    packet_id: u16,
    reason_code: u8,
}

impl PendingAck {
    /// The acknowledgement's fixed header byte ([`codec::ack_header`]).
    pub(super) fn header(self) -> u8 {
        if self.rec {
            codec::ack_header::PUBREC
        } else {
            codec::ack_header::PUBACK
        }
    }
}

/// A publish to give to the service that claims its topic, with the acknowledgement it gets once
/// its work is done.
pub(super) struct Handoff {
    service: Arc<dyn Service>,
    publish: ServicePublish,
    ack: Option<PendingAck>,
}

// Held unboxed like [`Handled`]: an allocation per request costs more than the moves.
#[allow(clippy::large_enum_variant)]
pub(super) enum Work {
    /// Finished; the answer to publish when it is this publish's turn.
    Done(Option<OutboundMessage>),
    Running(ServiceFuture),
    /// Handed back by the service: started once every earlier publish has finished.
    NotStarted(Box<ServicePublish>, Arc<dyn Service>),
}

/// The acknowledgement a publish of `qos` gets: PUBACK, PUBREC, or none at QoS 0.
pub(super) fn ack_for(qos: QoS, packet_id: u16, reason_code: u8) -> Option<PendingAck> {
    let rec = match qos {
        QoS::AtMostOnce => return None,
        QoS::AtLeastOnce => false,
        QoS::ExactlyOnce => true,
    };
    Some(PendingAck {
        rec,
        packet_id,
        reason_code,
    })
}

impl Conn {
    /// Checks and routes a PUBLISH, and acknowledges it unless a service claims its topic: then
    /// it is returned, for [`Conn::hand_over`]. Not `async`, so the packet is not moved
    /// into a future of its own on its way.
    pub(super) fn publish(&mut self, mut p: codec::Publish) -> Result<Option<Handoff>, Violation> {
        let v5 = self.v5();
        let counters = &self.inner.stats.here().traffic[self.category];
        crate::stats::add(&counters.publishes_received, 1);
        crate::stats::add(&counters.payload_bytes_received, p.payload.len() as u64);
        // Topic alias.
        if let Some(alias) = p.properties.topic_alias.take() {
            let max = self.inner.config.topic_alias_maximum;
            if alias == 0 || alias > max {
                return Err(Violation(reason::TOPIC_ALIAS_INVALID));
            }
            let idx = usize::from(alias - 1);
            if self.aliases.len() <= idx {
                self.aliases.resize(idx + 1, None);
            }
            if p.topic.is_empty() {
                match &self.aliases[idx] {
                    Some(t) => p.topic = t.clone(),
                    None => return Err(Violation(reason::PROTOCOL_ERROR)),
                }
            } else {
                self.aliases[idx] = Some(p.topic.clone());
            }
        } else if p.topic.is_empty() {
            return Err(Violation(if v5 {
                reason::PROTOCOL_ERROR
            } else {
                reason::MALFORMED_PACKET
            }));
        }
        if !topic::valid_topic_name(&p.topic) {
            return Err(Violation(reason::TOPIC_NAME_INVALID));
        }
        if p.properties
            .response_topic
            .as_deref()
            .is_some_and(|t| !topic::valid_topic_name(t))
        {
            return Err(Violation(reason::PROTOCOL_ERROR));
        }
        if !p.properties.subscription_identifiers.is_empty() {
            return Err(Violation(reason::PROTOCOL_ERROR));
        }
        let bad_payload = p.properties.payload_format_indicator == Some(1)
            && std::str::from_utf8(&p.payload).is_err();
        if bad_payload && p.qos == QoS::AtMostOnce {
            return Err(Violation(reason::PAYLOAD_FORMAT_INVALID));
        }
        if !self.may_publish(&p.topic) {
            // Not published; QoS 0 is dropped (and counted), QoS 1 and 2 get 0x87.
            if let Some(ack) = ack_for(p.qos, p.packet_id, reason::NOT_AUTHORIZED) {
                self.acknowledge(ack);
            }
            return Ok(None);
        }
        if p.retain && !p.payload.is_empty() && !self.inner.retained_room(&p.topic, &p.payload) {
            // Refused whole (not published either): the retained messages are at their limit.
            tracing::debug!(client_id = %self.client_id, topic = %p.topic, "retained message over the limit refused");
            if let Some(ack) = ack_for(p.qos, p.packet_id, reason::QUOTA_EXCEEDED) {
                self.acknowledge(ack);
            }
            return Ok(None);
        }
        if p.qos == QoS::ExactlyOnce {
            let mut st = self.session.state.lock();
            if st.incoming_qos2.contains(&p.packet_id) {
                // A redelivery of a message already accepted: acknowledge it again only.
                drop(st);
                self.acknowledge(PendingAck {
                    rec: true,
                    packet_id: p.packet_id,
                    reason_code: reason::SUCCESS,
                });
                return Ok(None);
            }
            if st.incoming_qos2.len() >= usize::from(self.inner.config.receive_maximum) {
                return Err(Violation(reason::RECEIVE_MAXIMUM_EXCEEDED));
            }
            if !bad_payload {
                st.incoming_qos2.insert(p.packet_id);
            }
        }
        let mut code = reason::SUCCESS;
        self.inner.renew_service_claims(&mut self.services);
        if bad_payload {
            code = reason::PAYLOAD_FORMAT_INVALID;
        } else if let Some(service) = self.services.find(&p.topic) {
            let service = service.clone();
            let sp = ServicePublish {
                topic: p.topic,
                payload: p.payload,
                qos: p.qos,
                properties: p.properties,
                from: self.ident.clone(),
            };
            return Ok(Some(Handoff {
                service,
                publish: sp,
                ack: ack_for(p.qos, p.packet_id, code),
            }));
        } else {
            let msg = Arc::new(Message {
                expires_at: p
                    .properties
                    .message_expiry_interval
                    .map(|s| Instant::now() + Duration::from_secs(u64::from(s))),
                topic: p.topic,
                payload: p.payload,
                qos: p.qos,
                retain: p.retain,
                properties: p.properties,
                publisher: Some(self.client_id.clone()),
            });
            self.published = true;
            if self.inner.route(msg) == 0 && v5 {
                code = reason::NO_MATCHING_SUBSCRIBERS;
            }
        }
        if let Some(ack) = ack_for(p.qos, p.packet_id, code) {
            self.acknowledge(ack);
        }
        Ok(None)
    }

    /// Sends an acknowledgement, after the answers and acknowledgements of the publishes still
    /// queued: they arrived first.
    pub(super) fn acknowledge(&mut self, ack: PendingAck) {
        self.finished(None, Some(ack));
    }

    /// A publish whose work is done: its answer is published and its acknowledgement sent now,
    /// or after those of the publishes still queued.
    pub(super) fn finished(&mut self, answer: Option<OutboundMessage>, ack: Option<PendingAck>) {
        if self.queued.is_empty() {
            self.answer_and_ack(answer, ack);
        } else if answer.is_some() || ack.is_some() {
            self.queued.push_back(Queued {
                work: Work::Done(answer),
                ack,
            });
        }
    }

    pub(super) fn answer_and_ack(&self, answer: Option<OutboundMessage>, ack: Option<PendingAck>) {
        if let Some(answer) = answer {
            self.inner.publish(answer);
        }
        if let Some(ack) = ack {
            self.session
                .send_ack(self.conn_id, ack.header(), ack.packet_id, ack.reason_code);
        }
    }

    /// How many publishes may be queued (under way or waiting) before the next one waits.
    pub(super) fn work_limit(&self) -> usize {
        usize::from(self.inner.config.receive_maximum).max(1)
    }

    /// Waits until fewer than [`Conn::work_limit`] publishes are queued.
    pub(super) async fn wait_for_room(&mut self) {
        while self.queued.len() >= self.work_limit() {
            std::future::poll_fn(|cx| self.poll_queued(cx)).await;
        }
    }

    /// Hands a publish to its service and goes on: its acknowledgement is sent once the work
    /// has finished and the earlier publishes have been acknowledged (see [`crate::service`]).
    pub(super) fn hand_over(&mut self, handoff: Handoff, cx: &mut Context<'_>) {
        let Handoff {
            service,
            publish,
            ack,
        } = handoff;
        let was_empty = self.queued.is_empty();
        let work = if matches!(
            self.queued.back(),
            Some(Queued {
                work: Work::NotStarted(..),
                ..
            })
        ) {
            // Behind a publish that waits for its turn: so does this one.
            Work::NotStarted(Box::new(publish), service)
        } else {
            let earlier = !self.queued.is_empty();
            self.start(&service, publish, earlier, cx)
        };
        match work {
            Work::Done(answer) => self.finished(answer, ack),
            work => {
                // A publish left waiting to start may be started alongside on the next look.
                self.front_fresh = match work {
                    Work::Running(_) => self.front_fresh || was_empty,
                    _ => false,
                };
                self.queued.push_back(Queued { work, ack });
            }
        }
    }

    /// Offers a publish to its service; a future it returns is polled once at once, so the
    /// work starts in arrival order.
    pub(super) fn start(
        &mut self,
        service: &Arc<dyn Service>,
        publish: ServicePublish,
        earlier_running: bool,
        cx: &mut Context<'_>,
    ) -> Work {
        // Output stays deferred while a service works, so an answer queued in the poll that
        // finishes it goes out with its acknowledgement, in one write.
        self.session.defer(self.conn_id);
        match service.on_publish(publish, earlier_running) {
            Handled::Done(answer) => Work::Done(answer),
            Handled::AfterEarlier(publish) if earlier_running => {
                Work::NotStarted(publish, service.clone())
            }
            Handled::AfterEarlier(publish) => {
                // Nothing earlier is under way: a service that hands it back anyway would see
                // it again at once, for ever. Dropped, as a service error.
                tracing::warn!(client_id = %self.client_id, topic = %publish.topic, "a service handed back a publish with nothing before it; dropped");
                Work::Done(None)
            }
            Handled::Running(future) => self.poll_work(future, cx),
        }
    }

    /// Polls a service's future once.
    pub(super) fn poll_work(&mut self, mut future: ServiceFuture, cx: &mut Context<'_>) -> Work {
        match self.waker.poll(&mut future, cx) {
            Poll::Ready(answer) => Work::Done(answer),
            Poll::Pending => Work::Running(future),
        }
    }

    /// Polls the queued publishes' work in order, answering and acknowledging each finished one
    /// whose turn it is, and starts those not started yet once the service lets them. Ready
    /// once at least one was acknowledged.
    pub(super) fn poll_queued(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.front_fresh = false;
        let before = self.queued.len();
        // Output is deferred (and flushed at the end) only once there is some: most polls find
        // the oldest publish still under way and have nothing to write.
        let mut deferred = false;
        // The oldest publish's work is polled where it lies in the queue: an entry is a few
        // hundred bytes, and most polls leave it there.
        while let Some(front) = self.queued.front_mut() {
            let answer = match &mut front.work {
                Work::Done(answer) => answer.take(),
                Work::Running(future) => match self.waker.poll(future, cx) {
                    Poll::Ready(answer) => answer,
                    Poll::Pending => break,
                },
                Work::NotStarted(..) => {
                    // Everything before it has finished: its turn.
                    let Some(Queued {
                        work: Work::NotStarted(publish, service),
                        ack,
                    }) = self.queued.pop_front()
                    else {
                        break;
                    };
                    deferred = true;
                    match self.start(&service, *publish, false, cx) {
                        Work::Done(answer) => self.answer_and_ack(answer, ack),
                        work => {
                            self.queued.push_front(Queued { work, ack });
                            break;
                        }
                    }
                    continue;
                }
            };
            let ack = front.ack;
            self.queued.pop_front();
            if !deferred {
                self.session.defer(self.conn_id);
                deferred = true;
            }
            self.answer_and_ack(answer, ack);
        }
        deferred |= self.start_alongside(cx);
        if deferred {
            self.flush_inline();
        }
        if self.queued.len() < before {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Starts the publishes that wait for their turn while the service lets them run alongside
    /// the ones under way before them (writes behind writes, say), oldest first. Returns
    /// whether it offered any to the service (which defers output, see [`Conn::start`]).
    pub(super) fn start_alongside(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(first) = self
            .queued
            .iter()
            .position(|q| matches!(q.work, Work::NotStarted(..)))
        else {
            return false;
        };
        if first == 0 {
            return false;
        }
        for at in first..self.queued.len() {
            let Some(queued) = self.queued.get_mut(at) else {
                break;
            };
            let Work::NotStarted(publish, service) =
                std::mem::replace(&mut queued.work, Work::Done(None))
            else {
                break;
            };
            let work = self.start(&service, *publish, true, cx);
            let still_waiting = matches!(work, Work::NotStarted(..));
            if let Some(queued) = self.queued.get_mut(at) {
                queued.work = work;
            }
            if still_waiting {
                break;
            }
        }
        true
    }

    /// Waits until every queued publish has finished and been acknowledged.
    pub(super) async fn finish_queued(&mut self) {
        while !self.queued.is_empty() {
            std::future::poll_fn(|cx| self.poll_queued(cx)).await;
        }
    }

    /// The connection has ended: work under way runs to completion on its own and its answers
    /// are published (a persistent session keeps them); publishes not started are dropped,
    /// unacknowledged.
    pub(super) fn let_running_finish(&mut self) {
        for queued in self.queued.drain(..) {
            let inner = self.inner.clone();
            match queued.work {
                Work::Running(future) => {
                    tokio::spawn(async move {
                        if let Some(answer) = future.await {
                            inner.publish(answer);
                        }
                    });
                }
                Work::Done(Some(answer)) => {
                    inner.publish(answer);
                }
                Work::Done(None) | Work::NotStarted(..) => {}
            }
        }
    }
}
