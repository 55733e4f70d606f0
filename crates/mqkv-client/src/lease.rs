//! Leases: a key that names its holder and expires unless renewed.
//!
//! The protocol pattern every SDK follows: acquire and renew with
//! `SET <name> <holder> NEX PX <ttl>` (no fencing token), release with
//! `VDEL <name> <holder>`. The version the SET returns is the fencing
//! token, to be sent as `__ft` with writes to the keys the lease protects.
//!
//! Invariant: [`Lease::fencing_token`] is the version of this holder's
//! latest successful acquire or renewal, and is cleared on release.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use mqkv_protocol::Hlc;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::{Client, SetOutcome, VDelOutcome, Versioned};
use crate::clock::after;
use crate::error::{Error, Result};
use crate::options::SetOptions;

/// A named lease held (or wanted) by one holder.
///
/// ```no_run
/// use std::time::Duration;
/// use mqkv_client::Lease;
///
/// # async fn demo(client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
/// let lease = Lease::new(&client, "backup-job", "node-1");
/// if let Some(token) = lease.acquire(Duration::from_secs(10)).await? {
///     println!("holding it; fencing token {token}");
///     lease.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Lease {
    client: Client,
    name: Bytes,
    holder: Bytes,
    token: Arc<Mutex<Option<Hlc>>>,
}

impl Lease {
    /// A lease on key `name` for `holder`. Holders must be unique among
    /// the contenders: two with the same name would both "hold" it.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// let lease = mqkv_client::Lease::new(&client, "backup-job", "node-1");
    /// # }
    /// ```
    pub fn new(client: &Client, name: impl Into<Bytes>, holder: impl Into<Bytes>) -> Lease {
        Lease {
            client: client.clone(),
            name: name.into(),
            holder: holder.into(),
            token: Arc::new(Mutex::new(None)),
        }
    }

    /// A lease on key `name` whose holder is the client id.
    ///
    /// ```no_run
    /// # fn demo(client: mqkv_client::Client) {
    /// let lease = mqkv_client::Lease::for_client(&client, "backup-job");
    /// assert_eq!(lease.holder_name(), client.client_id().as_bytes());
    /// # }
    /// ```
    pub fn for_client(client: &Client, name: impl Into<Bytes>) -> Lease {
        let holder = Bytes::copy_from_slice(client.client_id().as_bytes());
        Lease::new(client, name, holder)
    }

    /// The lease key.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// let lease = mqkv_client::Lease::new(&client, "backup-job", "node-1");
    /// assert_eq!(lease.name(), "backup-job");
    /// # }
    /// ```
    pub fn name(&self) -> &Bytes {
        &self.name
    }

    /// The value this holder writes into the lease key.
    ///
    /// ```
    /// # fn demo(client: mqkv_client::Client) {
    /// let lease = mqkv_client::Lease::new(&client, "backup-job", "node-1");
    /// assert_eq!(lease.holder_name(), "node-1");
    /// # }
    /// ```
    pub fn holder_name(&self) -> &Bytes {
        &self.holder
    }

    /// The client the lease uses.
    ///
    /// ```
    /// # fn demo(lease: mqkv_client::Lease) {
    /// println!("held as {}", lease.client().client_id());
    /// # }
    /// ```
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn set_token(&self, token: Option<Hlc>) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = token;
    }

    /// The fencing token of the latest successful acquire or renewal, if
    /// this holder believes it holds the lease.
    ///
    /// ```no_run
    /// # async fn demo(lease: mqkv_client::Lease, client: mqkv_client::Client) -> Result<(), mqkv_client::Error> {
    /// use mqkv_client::SetOptions;
    /// if let Some(token) = lease.fencing_token() {
    ///     client.set_with("protected", "data", &SetOptions::new().fencing_token(token)).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> Option<Hlc> {
        self.token.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Tries once to take the lease for `ttl` (or to extend it, if this
    /// holder already has it). Returns the fencing token, or `None` if
    /// another holder has the lease.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(lease: mqkv_client::Lease) -> Result<(), mqkv_client::Error> {
    /// match lease.acquire(Duration::from_secs(5)).await? {
    ///     Some(token) => println!("acquired, token {token}"),
    ///     None => println!("held by someone else"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, ttl: Duration) -> Result<Option<Hlc>> {
        let options = SetOptions::new().nex().expires_in(ttl);
        match self
            .client
            .set_with(self.name.clone(), self.holder.clone(), &options)
            .await?
        {
            SetOutcome::Applied { version } => {
                self.set_token(Some(version.clone()));
                Ok(Some(version))
            }
            SetOutcome::NotApplied { .. } => {
                self.set_token(None);
                Ok(None)
            }
        }
    }

    /// Extends the lease by `ttl` from now; the same request as
    /// [`Lease::acquire`]. `None` means the lease was lost to another holder.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(lease: mqkv_client::Lease) -> Result<(), mqkv_client::Error> {
    /// if lease.renew(Duration::from_secs(5)).await?.is_none() {
    ///     eprintln!("lost the lease");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn renew(&self, ttl: Duration) -> Result<Option<Hlc>> {
        self.acquire(ttl).await
    }

    /// Gives the lease up (`VDEL name holder`). True if this holder had it.
    ///
    /// ```no_run
    /// # async fn demo(lease: mqkv_client::Lease) -> Result<(), mqkv_client::Error> {
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn release(&self) -> Result<bool> {
        self.set_token(None);
        let outcome = self
            .client
            .vdel(self.name.clone(), self.holder.clone())
            .await?;
        Ok(matches!(outcome, VDelOutcome::Deleted { .. }))
    }

    /// Who holds the lease now, with the version of their latest
    /// acquire or renewal; `None` if nobody does.
    ///
    /// ```no_run
    /// # async fn demo(lease: mqkv_client::Lease) -> Result<(), mqkv_client::Error> {
    /// if let Some(holder) = lease.holder().await? {
    ///     println!("held by {:?} since {}", holder.value, holder.version);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn holder(&self) -> Result<Option<Versioned>> {
        self.client.get(self.name.clone()).await
    }

    /// Renews the lease for `ttl` every `every` in a background task until
    /// the returned [`Renewal`] is dropped or stopped. Call it after a
    /// successful [`Lease::acquire`]; `every` should be well below `ttl`
    /// (a third is usual).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(lease: mqkv_client::Lease) -> Result<(), mqkv_client::Error> {
    /// let ttl = Duration::from_secs(9);
    /// if lease.acquire(ttl).await?.is_some() {
    ///     let mut renewal = lease.keep_renewed(ttl, ttl / 3);
    ///     tokio::select! {
    ///         lost = renewal.lost() => eprintln!("lease lost: {lost:?}"),
    ///         _ = tokio::time::sleep(Duration::from_secs(60)) => {}
    ///     }
    ///     renewal.stop();
    ///     lease.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn keep_renewed(&self, ttl: Duration, every: Duration) -> Renewal {
        let (tx, rx) = watch::channel(None);
        let every = every.max(Duration::from_millis(10));
        let lease = Lease {
            // Each attempt must end in time to try again before the lease runs out.
            client: self.client.with_timeout(self.client.timeout().min(every)),
            ..self.clone()
        };
        let task = tokio::spawn(async move {
            let mut held_until = after(Instant::now(), ttl);
            loop {
                tokio::time::sleep(every).await;
                let started = Instant::now();
                let lost = match lease.renew(ttl).await {
                    Ok(Some(_)) => {
                        held_until = after(started, ttl);
                        None
                    }
                    Ok(None) => Some(LeaseLost::TakenOver),
                    Err(Error::Closed) => Some(LeaseLost::Closed),
                    Err(error) if Instant::now() >= held_until => {
                        tracing::debug!(%error, "lease renewal failed past the expiry");
                        Some(LeaseLost::Expired)
                    }
                    Err(error) => {
                        tracing::debug!(%error, "lease renewal failed; retrying");
                        None
                    }
                };
                if let Some(lost) = lost {
                    lease.set_token(None);
                    let _ = tx.send(Some(lost));
                    return;
                }
            }
        });
        Renewal { task, lost: rx }
    }
}

/// Why a renewed lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseLost {
    /// Another holder has the lease.
    TakenOver,
    /// Renewals failed (connection or server trouble) until the lease ran out.
    Expired,
    /// The client was shut down.
    Closed,
}

/// A background renewal from [`Lease::keep_renewed`]; stops when dropped.
#[derive(Debug)]
pub struct Renewal {
    task: tokio::task::JoinHandle<()>,
    lost: watch::Receiver<Option<LeaseLost>>,
}

impl Renewal {
    /// Waits until the lease is lost.
    ///
    /// ```no_run
    /// # async fn demo(mut renewal: mqkv_client::Renewal) {
    /// let why = renewal.lost().await;
    /// eprintln!("lost: {why:?}");
    /// # }
    /// ```
    pub async fn lost(&mut self) -> LeaseLost {
        match self.lost.wait_for(Option::is_some).await {
            Ok(lost) => lost.unwrap_or(LeaseLost::Closed),
            Err(_) => LeaseLost::Closed,
        }
    }

    /// The reason, if the lease has been lost.
    ///
    /// ```no_run
    /// # fn demo(renewal: mqkv_client::Renewal) {
    /// assert!(renewal.is_lost().is_none());
    /// # }
    /// ```
    pub fn is_lost(&self) -> Option<LeaseLost> {
        *self.lost.borrow()
    }

    /// Stops renewing (the lease then runs out unless released).
    ///
    /// ```no_run
    /// # fn demo(renewal: mqkv_client::Renewal) {
    /// renewal.stop();
    /// # }
    /// ```
    pub fn stop(self) {
        // Drop does the work.
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.task.abort();
    }
}
