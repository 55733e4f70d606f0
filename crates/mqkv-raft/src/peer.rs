//! Links to the other nodes: one authenticated connection per peer, opened
//! when first needed and again after it breaks, carrying many requests at
//! once.
//!
//! Invariants:
//! - every call ends: with the peer's answer, or with an error once its
//!   deadline passes or its link breaks (a broken link fails every call
//!   waiting on it at once, and the next call opens a new one);
//! - answers are matched to calls by number, never by order.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::rpc::{self, Envelope, Request, Response};
use crate::sync;
use crate::types::{NodeId, TypeConfig};
use crate::wire::{self, Credentials, FrameReader, FrameWriter};

/// Why a call got no answer.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CallError {
    #[error("node {node} at {addr} is unreachable: {reason}")]
    Unreachable {
        node: NodeId,
        addr: String,
        reason: String,
    },
    #[error("node {node} did not answer within {0:?}", .timeout)]
    Timeout { node: NodeId, timeout: Duration },
}

type Waiting = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// The peers this node acts as if cut off from (fault injection for tests).
type Blocked = Arc<Mutex<HashSet<NodeId>>>;

/// An open link: requests go to its writer task, answers come back through
/// `waiting`.
struct Link {
    outgoing: mpsc::UnboundedSender<Vec<u8>>,
    waiting: Waiting,
    /// Set by the reader when the link ends, before it fails the calls
    /// waiting then; a call registered later sees it.
    closed: Arc<AtomicBool>,
}

impl Link {
    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && !self.outgoing.is_closed()
    }
}

/// One peer node.
pub(crate) struct Peer {
    node: NodeId,
    addr: String,
    me: NodeId,
    credentials: Credentials,
    next_id: AtomicU64,
    link: tokio::sync::Mutex<Option<Arc<Link>>>,
    blocked: Blocked,
}

impl Peer {
    fn new(
        node: NodeId,
        addr: String,
        me: NodeId,
        credentials: Credentials,
        blocked: Blocked,
    ) -> Peer {
        Peer {
            node,
            addr,
            me,
            credentials,
            next_id: AtomicU64::new(1),
            link: tokio::sync::Mutex::new(None),
            blocked,
        }
    }

    fn unreachable(&self, reason: impl ToString) -> CallError {
        CallError::Unreachable {
            node: self.node,
            addr: self.addr.clone(),
            reason: reason.to_string(),
        }
    }

    /// Sends `request` and waits up to `timeout` (connecting included) for
    /// the answer.
    pub(crate) async fn call(
        &self,
        request: Request,
        timeout: Duration,
    ) -> Result<Response, CallError> {
        let node = self.node;
        if sync::lock(&self.blocked).contains(&node) {
            // As a network that drops every packet: no answer, ever.
            tokio::time::sleep(timeout).await;
            return Err(CallError::Timeout { node, timeout });
        }
        tokio::time::timeout(timeout, self.call_inner(request))
            .await
            .unwrap_or(Err(CallError::Timeout { node, timeout }))
    }

    /// Sends `request` without waiting for its answer. Requests posted one after another to
    /// one peer leave in that order.
    pub(crate) async fn post(&self, request: Request) -> Result<(), CallError> {
        let (link, _, frame) = self.framed(request).await?;
        link.outgoing
            .send(frame)
            .map_err(|_| self.unreachable("the link closed"))
    }

    /// The open link and `request` numbered and encoded for it; refused while fault injection
    /// cuts this peer off.
    async fn framed(&self, request: Request) -> Result<(Arc<Link>, u64, Vec<u8>), CallError> {
        if sync::lock(&self.blocked).contains(&self.node) {
            return Err(self.unreachable("cut off by fault injection"));
        }
        let link = self.link().await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame =
            rpc::encode(&Envelope { id, body: request }).map_err(|e| self.unreachable(e))?;
        Ok((link, id, frame))
    }

    async fn call_inner(&self, request: Request) -> Result<Response, CallError> {
        self.send(request).await?.answer().await
    }

    /// Sends `request` and returns at once with what waits for its answer. Requests sent one
    /// after another to one peer leave, and arrive, in that order.
    pub(crate) async fn send(&self, request: Request) -> Result<Sent, CallError> {
        let (link, id, frame) = self.framed(request).await?;
        let (tx, rx) = oneshot::channel();
        sync::lock(&link.waiting).insert(id, tx);
        let sent = Sent {
            rx,
            waiting: link.waiting.clone(),
            id,
            node: self.node,
            addr: self.addr.clone(),
        };
        if link.closed.load(Ordering::Acquire) {
            return Err(self.unreachable("the link broke"));
        }
        if link.outgoing.send(frame).is_err() {
            return Err(self.unreachable("the link closed"));
        }
        Ok(sent)
    }

    /// The open link, or a new one.
    async fn link(&self) -> Result<Arc<Link>, CallError> {
        let mut slot = self.link.lock().await;
        if let Some(link) = slot.as_ref().filter(|l| l.is_open()) {
            return Ok(link.clone());
        }
        *slot = None;
        let stream = TcpStream::connect(&self.addr)
            .await
            .map_err(|e| self.unreachable(e))?;
        let (reader, writer, node) = wire::connect(stream, &self.credentials, self.me, &self.addr)
            .await
            .map_err(|e| self.unreachable(e))?;
        if node != self.node {
            return Err(self.unreachable(format!("the node there is node {node}")));
        }
        let waiting: Waiting = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (outgoing, queue) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            outgoing,
            waiting: waiting.clone(),
            closed: closed.clone(),
        });
        let (reader_done, ended) = oneshot::channel();
        tokio::spawn(write_loop(writer, queue, ended));
        tokio::spawn(read_loop(reader, waiting, closed, reader_done, self.node));
        *slot = Some(link.clone());
        Ok(link)
    }
}

/// A request sent to a peer, waiting for its answer; forgotten when dropped.
pub(crate) struct Sent {
    rx: oneshot::Receiver<Response>,
    waiting: Waiting,
    id: u64,
    node: NodeId,
    addr: String,
}

impl Sent {
    /// The answer, or why none will come.
    pub(crate) async fn answer(mut self) -> Result<Response, CallError> {
        (&mut self.rx).await.map_err(|_| CallError::Unreachable {
            node: self.node,
            addr: self.addr.clone(),
            reason: "the link broke".to_owned(),
        })
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        sync::lock(&self.waiting).remove(&self.id);
    }
}

/// Writes queued requests, flushing once the queue is empty. Ends when the
/// link is dropped, a write fails or the reader ended (each closes the
/// queue, so the link counts as broken).
async fn write_loop(
    mut writer: FrameWriter,
    mut queue: mpsc::UnboundedReceiver<Vec<u8>>,
    mut reader_ended: oneshot::Receiver<()>,
) {
    loop {
        let frame = tokio::select! {
            frame = queue.recv() => frame,
            _ = &mut reader_ended => None,
        };
        let Some(frame) = frame else { return };
        if writer.write_batch(frame, &mut queue).await.is_err() {
            return;
        }
    }
}

/// Hands answers to their callers. When the link ends, every caller still
/// waiting is told at once (its sender is dropped).
async fn read_loop(
    mut reader: FrameReader,
    waiting: Waiting,
    closed: Arc<AtomicBool>,
    _done: oneshot::Sender<()>,
    node: NodeId,
) {
    loop {
        match reader.read().await {
            Ok(Some(frame)) => match rpc::decode::<Response>(&frame) {
                Ok(Envelope { id, body }) => {
                    if let Some(caller) = sync::lock(&waiting).remove(&id) {
                        let _ = caller.send(body);
                    }
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "an answer from a peer does not decode; closing the link");
                    break;
                }
            },
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(node, error = %e, "link to a peer ended");
                break;
            }
        }
    }
    closed.store(true, Ordering::Release);
    sync::lock(&waiting).clear();
}

/// Every peer this node has talked to, by id. A peer whose address changes
/// (a node removed and added again elsewhere) gets a new link.
pub(crate) struct Peers {
    me: NodeId,
    credentials: Credentials,
    peers: Mutex<HashMap<NodeId, Arc<Peer>>>,
    blocked: Blocked,
}

impl Peers {
    pub(crate) fn new(me: NodeId, credentials: Credentials) -> Peers {
        Peers {
            me,
            credentials,
            peers: Mutex::default(),
            blocked: Blocked::default(),
        }
    }

    /// Acts as if the network dropped everything between this node and
    /// `nodes` (and nothing else), until called again. For fault injection.
    pub(crate) fn set_blocked(&self, nodes: HashSet<NodeId>) {
        *sync::lock(&self.blocked) = nodes;
    }

    pub(crate) fn is_blocked(&self, node: NodeId) -> bool {
        sync::lock(&self.blocked).contains(&node)
    }

    pub(crate) fn me(&self) -> NodeId {
        self.me
    }

    pub(crate) fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// The peer of member `node` of `raft`'s group, at the address the membership gives it;
    /// `None` for a node that is not a member.
    pub(crate) fn member(
        &self,
        raft: &openraft::Raft<TypeConfig>,
        node: NodeId,
    ) -> Option<Arc<Peer>> {
        let addr = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&node)
            .map(|n| n.addr.clone())?;
        Some(self.get(node, &addr))
    }

    pub(crate) fn get(&self, node: NodeId, addr: &str) -> Arc<Peer> {
        let mut peers = sync::lock(&self.peers);
        match peers.get(&node) {
            Some(peer) if peer.addr == addr => peer.clone(),
            _ => {
                let peer = Arc::new(Peer::new(
                    node,
                    addr.to_owned(),
                    self.me,
                    self.credentials.clone(),
                    self.blocked.clone(),
                ));
                peers.insert(node, peer.clone());
                peer
            }
        }
    }
}
