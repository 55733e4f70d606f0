//! What each packet a client sends does.

use std::task::{Context, Poll};

use bytes::BytesMut;

use super::publish::Handoff;
use super::{Conn, End, Violation};
use crate::access::Subscription;
use crate::codec::{self, reason, Packet, Properties};
use crate::session::Delivery;
use crate::topic;

/// Where a synchronous pass over the received packets stopped (see `Conn::process_ready`).
pub(super) enum Step {
    /// No whole packet left.
    Drained,
    /// A publish for a service, with the Receive Maximum of publishes queued already. Boxed,
    /// as is the DISCONNECT: both are rare, and every pass's result stays small to move.
    Room(Box<Handoff>),
    /// A DISCONNECT, handled once the queued publishes are done.
    Disconnect(Box<codec::Disconnect>),
}

impl Conn {
    /// Decodes and handles every whole packet in `buf`.
    pub(super) async fn process(
        &mut self,
        buf: &mut BytesMut,
        max_in: usize,
    ) -> Result<Option<End>, Violation> {
        self.front_fresh = false;
        loop {
            // Everything but the two waits below is done in one synchronous pass: no packet is
            // moved into a future of its own on its way to a service.
            let step =
                std::future::poll_fn(|cx| Poll::Ready(self.process_ready(buf, max_in, cx))).await?;
            match step {
                Step::Drained => return Ok(None),
                Step::Room(handoff) => {
                    // The Receive Maximum of publishes is queued already: wait for the oldest.
                    self.wait_for_room().await;
                    let mut handoff = Some(handoff);
                    std::future::poll_fn(|cx| {
                        if let Some(h) = handoff.take() {
                            self.hand_over(*h, cx);
                        }
                        Poll::Ready(())
                    })
                    .await;
                }
                Step::Disconnect(d) => {
                    // Every answer and acknowledgement first.
                    self.finish_queued().await;
                    return self.disconnect(&d).map(Some);
                }
            }
        }
    }

    /// Handles whole packets from `buf` until none is left or one has to wait (see [`Step`]).
    pub(super) fn process_ready(
        &mut self,
        buf: &mut BytesMut,
        max_in: usize,
        cx: &mut Context<'_>,
    ) -> Result<Step, Violation> {
        loop {
            // Most acknowledgements are a packet id and at most a reason code: taken as that.
            if let Some(ack) = codec::take_plain_ack(buf, self.level, max_in) {
                self.inner.touch();
                self.acknowledged(ack.header, ack.packet_id, ack.reason_code);
                continue;
            }
            let packet = match codec::decode(buf, Some(self.level), max_in) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(Step::Drained),
                Err(e) => return Err(Violation(e.reason_code())),
            };
            if matches!(
                packet,
                Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubRel(_) | Packet::PubComp(_)
            ) {
                self.inner.touch();
            }
            match packet {
                Packet::Publish(p) => {
                    self.has_published = true;
                    if let Some(handoff) = self.publish(p)? {
                        if self.queued.len() >= self.work_limit() {
                            return Ok(Step::Room(Box::new(handoff)));
                        }
                        self.hand_over(handoff, cx);
                    }
                }
                Packet::PubAck(a) => {
                    self.acknowledged(codec::ack_header::PUBACK, a.packet_id, a.reason_code);
                }
                Packet::PubComp(a) => {
                    self.acknowledged(codec::ack_header::PUBCOMP, a.packet_id, a.reason_code);
                }
                Packet::PubRec(a) => {
                    self.acknowledged(codec::ack_header::PUBREC, a.packet_id, a.reason_code);
                }
                Packet::PubRel(a) => {
                    let known = self.session.state.lock().incoming_qos2.remove(&a.packet_id);
                    self.session.send_ack(
                        self.conn_id,
                        codec::ack_header::PUBCOMP,
                        a.packet_id,
                        if known {
                            reason::SUCCESS
                        } else {
                            reason::PACKET_IDENTIFIER_NOT_FOUND
                        },
                    );
                }
                Packet::Subscribe(s) => self.subscribe(s)?,
                Packet::Unsubscribe(u) => {
                    let codes = u
                        .filters
                        .iter()
                        .map(|f| {
                            if self.inner.unsubscribe(&self.session, f) {
                                reason::SUCCESS
                            } else {
                                reason::NO_SUBSCRIPTION_EXISTED
                            }
                        })
                        .collect();
                    self.send(Packet::UnsubAck(codec::UnsubAck {
                        packet_id: u.packet_id,
                        properties: Properties::default(),
                        reason_codes: codes,
                    }));
                }
                Packet::PingReq => self.send(Packet::PingResp),
                Packet::Disconnect(d) => return Ok(Step::Disconnect(Box::new(d))),
                Packet::Auth(a) => self.auth(a)?,
                Packet::Connect(_)
                | Packet::ConnAck(_)
                | Packet::SubAck(_)
                | Packet::UnsubAck(_)
                | Packet::PingResp => return Err(Violation(reason::PROTOCOL_ERROR)),
            }
        }
    }

    /// A PUBACK, PUBCOMP or PUBREC (as `header` says, [`codec::ack_header`]) from the client
    /// for a message sent to it.
    pub(super) fn acknowledged(&self, header: u8, packet_id: u16, reason_code: u8) {
        if header == codec::ack_header::PUBREC {
            if !self.session.received(self.conn_id, packet_id, reason_code) {
                self.session.send_ack(
                    self.conn_id,
                    codec::ack_header::PUBREL,
                    packet_id,
                    reason::PACKET_IDENTIFIER_NOT_FOUND,
                );
            }
        } else {
            self.session.complete(self.conn_id, packet_id);
        }
    }

    /// Takes a DISCONNECT's session expiry and closes the session; how the connection ended.
    pub(super) fn disconnect(&mut self, d: &codec::Disconnect) -> Result<End, Violation> {
        if let Some(new_expiry) = d.properties.session_expiry_interval {
            if self.session_expiry == 0 && new_expiry != 0 {
                return Err(Violation(reason::PROTOCOL_ERROR));
            }
            let granted = new_expiry.min(self.inner.config.max_session_expiry);
            self.session_expiry = granted;
            self.session.state.lock().expiry_interval = granted;
        }
        self.session.close(self.conn_id, None);
        Ok(if d.reason_code == reason::DISCONNECT_WITH_WILL {
            End::Abnormal
        } else {
            End::Normal
        })
    }

    pub(super) fn subscribe(&mut self, s: codec::Subscribe) -> Result<(), Violation> {
        let identifier = s.properties.subscription_identifiers.first().copied();
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut retained = Vec::new();
        for (filter, opts) in &s.filters {
            let Some(spec) = topic::parse_filter(filter) else {
                codes.push(reason::TOPIC_FILTER_INVALID);
                continue;
            };
            if spec.group.is_some() && opts.no_local {
                return Err(Violation(reason::PROTOCOL_ERROR));
            }
            let grant = self.subscription(spec.group, spec.filter);
            if grant == Subscription::Denied {
                codes.push(self.inner.config.subscription_denied_reason);
                continue;
            }
            let filtered = grant == Subscription::Partly;
            let existed =
                self.inner
                    .subscribe_checked(&self.session, filter, *opts, identifier, filtered);
            codes.push(opts.qos as u8);
            let send_retained = spec.group.is_none()
                && match opts.retain_handling {
                    0 => true,
                    1 => !existed,
                    _ => false,
                };
            if send_retained {
                for m in self.inner.retained_matching(spec.filter) {
                    if filtered && !self.session.may_receive(&m.topic) {
                        continue;
                    }
                    retained.push(Delivery {
                        qos: m.qos.min(opts.qos),
                        message: m,
                        retain: true,
                        subscription_ids: identifier.into_iter().collect(),
                    });
                }
            }
        }
        self.send(Packet::SubAck(codec::SubAck {
            packet_id: s.packet_id,
            properties: Properties::default(),
            reason_codes: codes,
        }));
        self.session
            .enqueue_retained(retained, self.inner.queue_limits());
        Ok(())
    }
}
