//! Leases, locks and leader election against a real server.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{Server, WAIT};
use mqkv_client::{ErrorKind, LeaderElection, Lease, LeaseLost, Lock, SetOptions};

#[tokio::test]
async fn lease_acquire_holder_renew_release() {
    let server = Server::start();
    let a = server.client("lease-a").await;
    let b = server.client("lease-b").await;
    let lease_a = Lease::for_client(&a, "job");
    let lease_b = Lease::for_client(&b, "job");
    let ttl = Duration::from_secs(10);

    let token = lease_a.acquire(ttl).await.unwrap().expect("free lease");
    assert_eq!(lease_a.fencing_token(), Some(token.clone()));
    assert_eq!(lease_b.acquire(ttl).await.unwrap(), None, "held by a");
    assert_eq!(lease_b.fencing_token(), None);

    let holder = lease_b.holder().await.unwrap().expect("held");
    assert_eq!(holder.value, Bytes::from_static(b"lease-a"));
    assert_eq!(holder.version, token);

    let renewed = lease_a.renew(ttl).await.unwrap().expect("still mine");
    assert!(renewed > token, "each renewal is a newer version");
    assert_eq!(lease_a.fencing_token(), Some(renewed));

    assert!(!lease_b.release().await.unwrap(), "b never held it");
    assert!(lease_a.holder().await.unwrap().is_some());
    assert!(lease_a.release().await.unwrap());
    assert_eq!(lease_a.fencing_token(), None);
    assert!(lease_a.holder().await.unwrap().is_none());
    assert!(lease_b.acquire(ttl).await.unwrap().is_some());
}

#[tokio::test]
async fn the_fencing_token_of_a_lease_guards_other_keys() {
    let server = Server::start();
    let a = server.client("fence-a").await;
    let b = server.client("fence-b").await;
    let ttl = Duration::from_secs(1);

    let lease_a = Lease::for_client(&a, "fence-lock");
    let token_a = lease_a.acquire(ttl).await.unwrap().unwrap();
    a.set_with(
        "guarded",
        "from-a",
        &SetOptions::new().fencing_token(token_a.clone()),
    )
    .await
    .unwrap();

    // a stalls; its lease runs out and b takes over with a newer token.
    let lease_b = Lease::for_client(&b, "fence-lock");
    let token_b = loop {
        if let Some(t) = lease_b.acquire(ttl).await.unwrap() {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(token_b > token_a);
    b.set_with(
        "guarded",
        "from-b",
        &SetOptions::new().fencing_token(token_b),
    )
    .await
    .unwrap();
    // a wakes up and writes with its stale token: refused.
    let err = a
        .set_with("guarded", "late", &SetOptions::new().fencing_token(token_a))
        .await
        .unwrap_err();
    assert_eq!(err.server_kind(), Some(ErrorKind::FencingTokenLowerVersion));
    assert_eq!(a.get("guarded").await.unwrap().unwrap().value, "from-b");
}

#[tokio::test]
async fn renewal_keeps_a_lease_past_its_ttl_and_stopping_lets_it_expire() {
    let server = Server::start();
    let a = server.client("renew-a").await;
    let b = server.client("renew-b").await;
    let ttl = Duration::from_millis(1_500);
    let lease = Lease::for_client(&a, "renewed");
    let first = lease.acquire(ttl).await.unwrap().unwrap();
    let renewal = lease.keep_renewed(ttl, ttl / 3);

    tokio::time::sleep(ttl * 2).await;
    assert!(renewal.is_lost().is_none());
    let holder = Lease::for_client(&b, "renewed").holder().await.unwrap();
    assert_eq!(
        holder.map(|h| h.value),
        Some(Bytes::from_static(b"renew-a"))
    );
    assert!(
        lease.fencing_token().unwrap() > first,
        "the token follows renewals"
    );

    renewal.stop();
    let other = Lease::for_client(&b, "renewed");
    tokio::time::timeout(WAIT, async {
        while other.acquire(ttl).await.unwrap().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the unrenewed lease expires");
}

#[tokio::test]
async fn a_renewal_reports_a_lease_taken_over() {
    let server = Server::start();
    let a = server.client("lost-a").await;
    let b = server.client("lost-b").await;
    let ttl = Duration::from_secs(2);
    let lease = Lease::for_client(&a, "contested");
    lease.acquire(ttl).await.unwrap().unwrap();
    let mut renewal = lease.keep_renewed(ttl, Duration::from_millis(200));
    // Someone deletes the lease key and takes it. A renewal landing between the delete and
    // the take creates the key again (renewals may create it), so B tries until it wins.
    let taker = Lease::for_client(&b, "contested");
    tokio::time::timeout(WAIT, async {
        loop {
            b.del("contested").await.unwrap();
            if taker.acquire(ttl).await.unwrap().is_some() {
                break;
            }
        }
    })
    .await
    .expect("B takes the lease");
    let lost = tokio::time::timeout(WAIT, renewal.lost())
        .await
        .expect("noticed");
    assert_eq!(lost, LeaseLost::TakenOver);
    assert_eq!(lease.fencing_token(), None);
}

#[tokio::test]
async fn lock_waiters_are_woken_by_the_release() {
    let server = Server::start();
    let a = server.client("lock-a").await;
    let b = server.client("lock-b").await;
    // A long TTL: if the waiter got the lock, it was woken by the release.
    let ttl = Duration::from_secs(30);
    let lock_a = Lock::for_client(&a, "mutex");
    let lock_b = Lock::for_client(&b, "mutex");
    lock_a.lock(ttl).await.unwrap();

    let got = Arc::new(AtomicBool::new(false));
    let waiter = tokio::spawn({
        let got = got.clone();
        async move {
            let token = lock_b.lock(ttl).await.unwrap();
            got.store(true, Ordering::SeqCst);
            (lock_b, token)
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !got.load(Ordering::SeqCst),
        "b must wait while a holds the lock"
    );
    assert!(lock_a.unlock().await.unwrap());
    let (lock_b, token) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("b is woken by a's release")
        .unwrap();
    assert_eq!(lock_b.lease().fencing_token(), Some(token));
    let holder = lock_a.lease().holder().await.unwrap().unwrap();
    assert_eq!(holder.value, Bytes::from_static(b"lock-b"));
}

#[tokio::test]
async fn a_lock_left_by_a_vanished_holder_is_taken_after_it_expires() {
    let server = Server::start();
    let a = server.client("vanish-a").await;
    let b = server.client("vanish-b").await;
    let lock_a = Lock::for_client(&a, "abandoned");
    lock_a.lock(Duration::from_millis(800)).await.unwrap();
    a.disconnect().await;

    let lock_b = Lock::for_client(&b, "abandoned");
    tokio::time::timeout(WAIT, lock_b.lock(Duration::from_secs(10)))
        .await
        .expect("the expiry DELETE wakes the waiter")
        .unwrap();
}

#[tokio::test]
async fn lock_within_gives_up() {
    let server = Server::start();
    let a = server.client("within-a").await;
    let b = server.client("within-b").await;
    Lock::for_client(&a, "busy")
        .lock(Duration::from_secs(30))
        .await
        .unwrap();
    let got = Lock::for_client(&b, "busy")
        .lock_within(Duration::from_secs(30), Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(got, None);
}

#[tokio::test]
async fn critical_sections_never_overlap() {
    let server = Server::start();
    let inside = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let client = server.client(&format!("mutex-{i}")).await;
        let inside = inside.clone();
        let entries = entries.clone();
        tasks.push(tokio::spawn(async move {
            let lock = Lock::for_client(&client, "shared-mutex");
            for _ in 0..3 {
                lock.lock(Duration::from_secs(30)).await.unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "overlap");
                entries.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(lock.unlock().await.unwrap());
            }
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("every contender gets its turns")
            .unwrap();
    }
    assert_eq!(entries.load(Ordering::SeqCst), 9);
}

#[tokio::test]
async fn leader_election_campaign_watch_resign_failover() {
    let server = Server::start();
    let a = server.client("cand-a").await;
    let b = server.client("cand-b").await;
    let watcher = server.client("watcher").await;
    let term = Duration::from_secs(2);

    let election_a = LeaderElection::for_client(&a, "leader");
    let election_b = LeaderElection::for_client(&b, "leader");
    let mut watch = LeaderElection::for_client(&watcher, "leader")
        .observe_leader()
        .await
        .unwrap();
    assert_eq!(watch.current(), None);

    let leadership_a = election_a.campaign(term).await.unwrap();
    assert!(leadership_a.fencing_token().is_some());
    let change = tokio::time::timeout(WAIT, watch.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(change.leader, Some(Bytes::from_static(b"cand-a")));
    assert_eq!(
        election_b.leader().await.unwrap().map(|l| l.id),
        Some(Bytes::from_static(b"cand-a"))
    );

    // b campaigns and waits; a's renewals are not leader changes.
    let campaign_b = tokio::spawn(async move {
        let leadership = election_b.campaign(term).await.unwrap();
        (election_b, leadership)
    });
    tokio::time::sleep(term * 2).await;
    assert!(!campaign_b.is_finished(), "a still leads and renews");

    // a resigns: b takes over at once.
    leadership_a.resign().await.unwrap();
    let change = tokio::time::timeout(WAIT, watch.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(change.leader, None);
    let change = tokio::time::timeout(WAIT, watch.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(change.leader, Some(Bytes::from_static(b"cand-b")));
    let (election_b, leadership_b) = tokio::time::timeout(WAIT, campaign_b)
        .await
        .unwrap()
        .unwrap();

    // b dies without resigning (renewal stops): a is elected after the term.
    let election_a2 = LeaderElection::for_client(&a, "leader");
    drop(leadership_b);
    let again = tokio::time::timeout(WAIT, election_a2.campaign(term))
        .await
        .expect("a takes over once b's term runs out")
        .unwrap();
    assert!(again.fencing_token().is_some());
    assert!(!election_b.resign().await.unwrap(), "b no longer leads");
    watch.stop().await.unwrap();
}
