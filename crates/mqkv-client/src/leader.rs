//! Leader election: candidates campaign for a lock whose value names the
//! leader; the leader renews it for as long as it leads.
//!
//! Invariant: at most one candidate holds the election key at a time, and a
//! leader that stops renewing (crash, partition) is replaced once its term
//! runs out.

use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::Hlc;

use crate::client::Client;
use crate::error::Result;
use crate::lease::{Lease, LeaseLost, Renewal};
use crate::lock::Lock;
use crate::observe::{Observation, Operation};

/// One candidate in the election named by a key.
///
/// ```no_run
/// use std::time::Duration;
/// use mqkv_client::LeaderElection;
///
/// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
/// let election = LeaderElection::for_client(&client, "scheduler");
/// let mut leadership = election.campaign(Duration::from_secs(10)).await?;
/// println!("leading");
/// let why = leadership.lost().await;
/// println!("no longer leading: {why:?}");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaderElection {
    lock: Lock,
}

/// The current leader and the version of its latest term renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's candidate name.
    pub id: Bytes,
    /// Version of the election key (changes with every renewal).
    pub version: Hlc,
}

/// A change of leader, from [`LeaderWatch::changed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderChange {
    /// The new leader, or `None` when nobody leads.
    pub leader: Option<Bytes>,
    /// Version of the change.
    pub version: Hlc,
}

impl LeaderElection {
    /// Candidate `candidate` in the election held on key `name`.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// let election = mqkv_client::LeaderElection::new(&client, "scheduler", "node-1");
    /// # }
    /// ```
    pub fn new(client: &Client, name: impl Into<Bytes>, candidate: impl Into<Bytes>) -> Self {
        LeaderElection {
            lock: Lock::new(client, name, candidate),
        }
    }

    /// Candidate named after the client id.
    ///
    /// ```no_run
    /// # fn demo(client: mqkv_client::Client) {
    /// let election = mqkv_client::LeaderElection::for_client(&client, "scheduler");
    /// # }
    /// ```
    pub fn for_client(client: &Client, name: impl Into<Bytes>) -> Self {
        LeaderElection {
            lock: Lock::for_client(client, name),
        }
    }

    /// This candidate's name.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// let election = mqkv_client::LeaderElection::new(&client, "scheduler", "node-1");
    /// assert_eq!(election.candidate(), "node-1");
    /// # }
    /// ```
    pub fn candidate(&self) -> &Bytes {
        self.lock.lease().holder_name()
    }

    /// Waits until this candidate is elected, then keeps renewing its term
    /// (every third of `term`) until the returned [`Leadership`] is
    /// resigned, dropped, or lost.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(election: mqkv_client::LeaderElection) -> Result<(), mqkv_client::Error> {
    /// let leadership = election.campaign(Duration::from_secs(6)).await?;
    /// println!("elected with fencing token {:?}", leadership.fencing_token());
    /// leadership.resign().await?;
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self, term: Duration) -> Result<Leadership> {
        self.lock.lock(term).await?;
        let renewal = self.lock.lease().keep_renewed(term, term / 3);
        Ok(Leadership {
            lease: self.lock.lease().clone(),
            renewal,
        })
    }

    /// Tries once to become leader for `term`, without waiting or renewing.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(election: mqkv_client::LeaderElection) -> Result<(), mqkv_client::Error> {
    /// let elected = election.try_campaign(Duration::from_secs(6)).await?.is_some();
    /// # Ok(()) }
    /// ```
    pub async fn try_campaign(&self, term: Duration) -> Result<Option<Hlc>> {
        self.lock.try_lock(term).await
    }

    /// The current leader, if any.
    ///
    /// ```no_run
    /// # async fn demo(election: mqkv_client::LeaderElection) -> Result<(), mqkv_client::Error> {
    /// match election.leader().await? {
    ///     Some(leader) => println!("{:?} leads", leader.id),
    ///     None => println!("nobody leads"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.lock.lease().holder().await?.map(|v| Leader {
            id: v.value,
            version: v.version,
        }))
    }

    /// Follows who leads.
    ///
    /// ```no_run
    /// # async fn demo(election: mqkv_client::LeaderElection) -> Result<(), mqkv_client::Error> {
    /// let mut watch = election.observe_leader().await?;
    /// println!("now: {:?}", watch.current());
    /// while let Some(change) = watch.changed().await {
    ///     println!("leader: {:?}", change.leader);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn observe_leader(&self) -> Result<LeaderWatch> {
        let lease = self.lock.lease();
        let observation = lease.client().observe(lease.name().clone()).await?;
        let current = observation.initial().map(|v| v.value.clone());
        Ok(LeaderWatch {
            observation,
            current,
        })
    }

    /// Gives up leadership if this candidate has it (the key is only
    /// deleted if it still names this candidate). True if it was leader.
    ///
    /// ```no_run
    /// # async fn demo(election: mqkv_client::LeaderElection) -> Result<(), mqkv_client::Error> {
    /// election.resign().await?;
    /// # Ok(()) }
    /// ```
    pub async fn resign(&self) -> Result<bool> {
        self.lock.unlock().await
    }
}

/// Leadership won by [`LeaderElection::campaign`]. Renewal stops when this
/// is dropped; the term then runs out unless [`Leadership::resign`] ends it
/// at once.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    renewal: Renewal,
}

impl Leadership {
    /// The fencing token of the latest term renewal, while leading.
    ///
    /// ```no_run
    /// # fn demo(leadership: mqkv_client::Leadership) {
    /// println!("{:?}", leadership.fencing_token());
    /// # }
    /// ```
    pub fn fencing_token(&self) -> Option<Hlc> {
        self.lease.fencing_token()
    }

    /// Waits until leadership is lost (the term could not be renewed).
    ///
    /// ```no_run
    /// # async fn demo(mut leadership: mqkv_client::Leadership) {
    /// let why = leadership.lost().await;
    /// # }
    /// ```
    pub async fn lost(&mut self) -> LeaseLost {
        self.renewal.lost().await
    }

    /// Stops renewing and steps down at once.
    ///
    /// ```no_run
    /// # async fn demo(leadership: mqkv_client::Leadership) -> Result<(), mqkv_client::Error> {
    /// leadership.resign().await?;
    /// # Ok(()) }
    /// ```
    pub async fn resign(self) -> Result<()> {
        let Leadership { lease, renewal } = self;
        renewal.stop();
        lease.release().await?;
        Ok(())
    }
}

/// Follows the leader of an election; from [`LeaderElection::observe_leader`].
#[derive(Debug)]
pub struct LeaderWatch {
    observation: Observation,
    current: Option<Bytes>,
}

impl LeaderWatch {
    /// The leader as last seen.
    ///
    /// ```
    /// # async fn demo(election: mqkv_client::LeaderElection) -> Result<(), mqkv_client::Error> {
    /// let watch = election.observe_leader().await?;
    /// println!("leader: {:?}", watch.current());
    /// # Ok(()) }
    /// ```
    pub fn current(&self) -> Option<&Bytes> {
        self.current.as_ref()
    }

    /// Waits for the leader to change (term renewals by the same leader are
    /// not changes). `None` once the client is closed.
    ///
    /// ```no_run
    /// # async fn demo(mut watch: mqkv_client::LeaderWatch) {
    /// if let Some(change) = watch.changed().await {
    ///     println!("{:?}", change.leader);
    /// }
    /// # }
    /// ```
    pub async fn changed(&mut self) -> Option<LeaderChange> {
        loop {
            let change = self.observation.recv().await?;
            let leader = match change.operation {
                Operation::Set { value } => Some(value),
                Operation::Delete => None,
            };
            if leader != self.current {
                self.current = leader.clone();
                return Some(LeaderChange {
                    leader,
                    version: change.version,
                });
            }
        }
    }

    /// Stops following.
    ///
    /// ```no_run
    /// # async fn demo(watch: mqkv_client::LeaderWatch) -> Result<(), mqkv_client::Error> {
    /// watch.stop().await?;
    /// # Ok(()) }
    /// ```
    pub async fn stop(self) -> Result<()> {
        self.observation.unobserve().await
    }
}
