//! Locks: a lease that callers wait for.
//!
//! The algorithm every SDK uses: observe the lock key, then loop { try to
//! acquire the lease; if another holder has it, wait for the key's DELETE
//! notification (release or expiry) }, then stop observing.
//!
//! Invariants:
//! - The observation starts before the first attempt, so a release between
//!   a failed attempt and the wait is never missed.
//! - An acquire that has been sent is never abandoned half-way: deadlines
//!   are only checked between attempts, so a caller told "not acquired"
//!   does not secretly hold the lock.

use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::Hlc;
use tokio::time::Instant;

use crate::client::Client;
use crate::clock::after;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::observe::{Observation, Operation};

/// A distributed lock built on a [`Lease`].
///
/// ```no_run
/// use std::time::Duration;
/// use mqkv_client::Lock;
///
/// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
/// let lock = Lock::for_client(&client, "inventory-lock");
/// let token = lock.lock(Duration::from_secs(10)).await?;
/// // ... critical section; protect writes with `token` ...
/// lock.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Lock {
    lease: Lease,
}

impl Lock {
    /// A lock on key `name` for `holder`.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// let lock = mqkv_client::Lock::new(&client, "inventory-lock", "worker-3");
    /// # }
    /// ```
    pub fn new(client: &Client, name: impl Into<Bytes>, holder: impl Into<Bytes>) -> Lock {
        Lock {
            lease: Lease::new(client, name, holder),
        }
    }

    /// A lock on key `name` whose holder is the client id.
    ///
    /// ```no_run
    /// # fn demo(client: mqkv_client::Client) {
    /// let lock = mqkv_client::Lock::for_client(&client, "inventory-lock");
    /// # }
    /// ```
    pub fn for_client(client: &Client, name: impl Into<Bytes>) -> Lock {
        Lock {
            lease: Lease::for_client(client, name),
        }
    }

    /// The lease underneath: its fencing token, renewal, holder.
    ///
    /// ```no_run
    /// # fn demo(lock: mqkv_client::Lock) {
    /// println!("{:?}", lock.lease().fencing_token());
    /// # }
    /// ```
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Takes the lock if it is free, without waiting.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(lock: mqkv_client::Lock) -> Result<(), mqkv_client::Error> {
    /// if let Some(token) = lock.try_lock(Duration::from_secs(10)).await? {
    ///     println!("locked, token {token}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_lock(&self, ttl: Duration) -> Result<Option<Hlc>> {
        self.lease.acquire(ttl).await
    }

    /// Waits as long as it takes to get the lock, then holds it for `ttl`
    /// (renew it with [`Lease::keep_renewed`] for longer work). Returns the
    /// fencing token.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(lock: mqkv_client::Lock) -> Result<(), mqkv_client::Error> {
    /// let token = lock.lock(Duration::from_secs(10)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock(&self, ttl: Duration) -> Result<Hlc> {
        match self.lock_until(ttl, None).await? {
            Some(token) => Ok(token),
            None => Err(Error::Closed),
        }
    }

    /// Like [`Lock::lock`], but gives up (returning `None`) once `wait` has
    /// passed without getting the lock.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(lock: mqkv_client::Lock) -> Result<(), mqkv_client::Error> {
    /// match lock.lock_within(Duration::from_secs(10), Duration::from_secs(30)).await? {
    ///     Some(_token) => println!("locked"),
    ///     None => println!("still busy after 30 s"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lock_within(&self, ttl: Duration, wait: Duration) -> Result<Option<Hlc>> {
        self.lock_until(ttl, Some(after(Instant::now(), wait)))
            .await
    }

    async fn lock_until(&self, ttl: Duration, deadline: Option<Instant>) -> Result<Option<Hlc>> {
        let mut observation = self
            .lease
            .client()
            .observe(self.lease.name().clone())
            .await?;
        let result = self.acquire_loop(&mut observation, ttl, deadline).await;
        // The outcome stands whatever the unobserve says: failing here
        // after acquiring would leave the lock held by nobody who knows it.
        let _ = observation.unobserve().await;
        result
    }

    async fn acquire_loop(
        &self,
        observation: &mut Observation,
        ttl: Duration,
        deadline: Option<Instant>,
    ) -> Result<Option<Hlc>> {
        loop {
            if let Some(token) = self.lease.acquire(ttl).await? {
                return Ok(Some(token));
            }
            // Wake up for the holder's DELETE; as a safety net also retry
            // after a lease period, which is when a lease left behind by a
            // vanished holder expires at the latest.
            let mut wait = ttl.max(Duration::from_millis(100));
            if let Some(deadline) = deadline {
                let remaining = deadline.saturating_duration_since(Instant::now());
                if remaining.is_zero() {
                    return Ok(None);
                }
                wait = wait.min(remaining);
            }
            wait_for_delete(observation, wait).await?;
        }
    }

    /// Releases the lock. True if this holder had it.
    ///
    /// ```no_run
    /// # async fn demo(lock: mqkv_client::Lock) -> Result<(), mqkv_client::Error> {
    /// lock.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub async fn unlock(&self) -> Result<bool> {
        self.lease.release().await
    }
}

/// Returns on the first DELETE or when `wait` has passed.
async fn wait_for_delete(observation: &mut Observation, wait: Duration) -> Result<()> {
    let until = after(Instant::now(), wait);
    loop {
        let remaining = until.saturating_duration_since(Instant::now());
        match observation.recv_timeout(remaining).await? {
            Some(change) if change.operation == Operation::Delete => return Ok(()),
            Some(_) => {}
            None => return Ok(()),
        }
    }
}
