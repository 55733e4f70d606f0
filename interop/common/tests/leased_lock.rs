//! mqkv driven by the official AIO Rust SDK lease and lock clients (`leased_lock` feature).
//!
//! The lease/lock helpers are purely client-side: `SET name holder NEX PX ms` to acquire or
//! renew, the SET response's `__ts` as fencing token, `VDEL name holder` to release and
//! KEYNOTIFY to wait. Shared by the `aio-stable` and `aio-beta` crates.

#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use azure_iot_operations_services::leased_lock::{self, lease, lock};
use azure_iot_operations_services::state_store::{ServiceError, SetOptions};

use support::*;

/// The lease `name` as `client` sees it, held under the client's id.
fn lease_of(client: &AioClient, name: &[u8]) -> lease::Client {
    lease::Client::new(
        client.state_store.clone(),
        name.to_vec(),
        client.id.clone().into_bytes(),
    )
    .unwrap()
}

/// The lock `name` as `client` sees it, held under the client's id.
fn lock_of(client: &AioClient, name: &[u8]) -> lock::Client {
    lock::Client::new(
        client.state_store.clone(),
        name.to_vec(),
        client.id.clone().into_bytes(),
    )
    .unwrap()
}

#[track_caller]
fn assert_lease_already_held(r: Result<impl std::fmt::Debug, leased_lock::Error>) {
    match r {
        Err(e) => assert!(
            matches!(e.kind(), leased_lock::ErrorKind::LeaseAlreadyHeld),
            "expected LeaseAlreadyHeld, got {e:?}"
        ),
        Ok(v) => panic!("expected LeaseAlreadyHeld, but the lease was acquired: {v:?}"),
    }
}

/// Auto-renewal: every second, of a lease or lock of three seconds.
const RENEWAL: Duration = Duration::from_secs(1);
const RENEWED_EXPIRY: Duration = Duration::from_secs(3);

/// Takes the renewal SETs of `holder` that `obs` has queued, then waits for a fresh one and
/// for half a renewal period after it; returns how many SETs it saw. The SDK stops a renewal
/// task that is asleep when the lease is released; one caught in the middle of its request
/// goes on renewing, so a release must come between renewals, not race one.
async fn between_renewals(
    obs: &mut leased_lock::LeaseObservation,
    name: &[u8],
    holder: &[u8],
) -> usize {
    let mut sets = 0;
    while let Ok(Some((n, _))) =
        tokio::time::timeout(Duration::from_millis(100), obs.recv_notification()).await
    {
        assert_set_notification(&n, name, holder);
        sets += 1;
    }
    assert_set_notification(
        &next_notification(obs, Duration::from_secs(5)).await,
        name,
        holder,
    );
    tokio::time::sleep(RENEWAL / 2).await;
    sets + 1
}

/// Renewals keep equal HLC counters however busy the store is: a key's counter moves only for
/// writes to that key, not for writes to other keys in the same millisecond (the SDK's own
/// auto-renewal test asserts equal counters while its other tests run in parallel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_renewals_keep_their_counter_while_other_keys_are_written() {
    let server = Server::start("lease_renewals_keep_their_counter_while_other_keys_are_written");
    let a = AioClient::connect(&server, &client_id("busy-lease", "a")).await;
    let writers = AioClient::connect_with_extra(&server, &client_id("busy-lease", "w"), 7).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (w, ss) in std::iter::once(&writers.state_store)
        .chain(&writers.extra)
        .enumerate()
    {
        let ss = ss.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("busy/{w}/{}", n % 64).into_bytes();
                ss.set(key, b"x".to_vec(), TIMEOUT, None, SetOptions::default())
                    .await
                    .expect("a write to another key");
                n += 1;
            }
            n
        }));
    }
    let lease = lease_of(&a, b"busy/lease");
    let mut tokens = Vec::new();
    for _ in 0..20 {
        tokens.push(
            lease
                .acquire(Duration::from_secs(10), TIMEOUT, None)
                .await
                .expect("acquire or renew"),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut written = 0;
    for t in tasks {
        written += t.await.expect("writer");
    }
    assert!(written > 100, "too few writes to other keys to tell: {written}");
    for pair in tokens.windows(2) {
        assert_later(&pair[1], &pair[0], "renewal token");
    }
    let counters: Vec<u64> = tokens.iter().map(|t| t.counter).collect();
    assert!(
        counters.iter().skip(1).all(|c| *c == counters[1]),
        "renewals 100 ms apart carry different HLC counters while {written} other writes ran: {counters:?}"
    );
    a.close().await;
    writers.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_acquire_renew_release_and_holder() {
    let server = Server::start("lease_acquire_renew_release_and_holder");
    let a = AioClient::connect(&server, &client_id("lease", "a")).await;
    let b = AioClient::connect(&server, &client_id("lease", "b")).await;
    let name = b"lease/one".to_vec();
    let lease_a = lease_of(&a, &name);
    let lease_b = lease_of(&b, &name);

    assert_eq!(
        lease_a.get_holder(TIMEOUT).await.unwrap(),
        None,
        "nobody holds a fresh lease"
    );

    let t1 = lease_a
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .expect("acquire a free lease");
    assert_eq!(lease_a.current_lease_fencing_token().as_ref(), Some(&t1));
    assert_eq!(
        lease_a.get_holder(TIMEOUT).await.unwrap(),
        Some(a.id.clone().into_bytes())
    );
    assert_eq!(
        lease_b.get_holder(TIMEOUT).await.unwrap(),
        Some(a.id.clone().into_bytes())
    );

    // Contention: B is refused while A holds it.
    assert_lease_already_held(
        lease_b
            .acquire(Duration::from_secs(10), TIMEOUT, None)
            .await,
    );
    assert_eq!(lease_b.current_lease_fencing_token(), None);

    // Renewal by the holder: a new, later token from the same server node. Sequential
    // renewals get the same HLC counter (versions come from the server clock).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t2 = lease_a
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .expect("renew");
    assert_later(&t2, &t1, "renewed lease token");
    assert_eq!(
        t2.node_id, t1.node_id,
        "fencing tokens must come from one stable server node id"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t3 = lease_a
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .expect("renew again");
    assert_later(&t3, &t2, "second renewal token");
    assert_eq!(t3.node_id, t2.node_id);
    assert_eq!(
        t3.counter, t2.counter,
        "renewals 1.5 s apart should carry equal HLC counters"
    );
    assert_eq!(lease_a.current_lease_fencing_token().as_ref(), Some(&t3));

    // Release by a non-holder does not free it (VDEL value mismatch).
    lease_b
        .release(TIMEOUT)
        .await
        .expect("release by a non-holder is not an error");
    assert_eq!(
        lease_a.get_holder(TIMEOUT).await.unwrap(),
        Some(a.id.clone().into_bytes())
    );

    // Release by the holder frees it; B can take it and gets a later token.
    lease_a.release(TIMEOUT).await.unwrap();
    assert_eq!(lease_a.current_lease_fencing_token(), None);
    assert_eq!(lease_a.get_holder(TIMEOUT).await.unwrap(), None);
    let t4 = lease_b
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .expect("B acquires after release");
    assert_later(&t4, &t3, "next holder's token");
    assert_eq!(
        lease_b.get_holder(TIMEOUT).await.unwrap(),
        Some(b.id.clone().into_bytes())
    );
    assert_lease_already_held(
        lease_a
            .acquire(Duration::from_secs(10), TIMEOUT, None)
            .await,
    );
    lease_b.release(TIMEOUT).await.unwrap();
    assert_eq!(lease_b.get_holder(TIMEOUT).await.unwrap(), None);

    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expires_and_observer_sees_delete() {
    let server = Server::start("lease_expires_and_observer_sees_delete");
    let a = AioClient::connect(&server, &client_id("leaseexp", "a")).await;
    let b = AioClient::connect(&server, &client_id("leaseexp", "b")).await;
    let name = b"lease/expiring".to_vec();
    let lease_a = lease_of(&a, &name);
    let lease_b = lease_of(&b, &name);

    let mut obs = lease_b.observe(TIMEOUT).await.expect("observe the lease");
    let acquired = Instant::now();
    let ta = lease_a
        .acquire(Duration::from_millis(2500), TIMEOUT, None)
        .await
        .unwrap();
    let n = next_notification(&mut obs, Duration::from_secs(5)).await;
    assert_set_notification(&n, &name, a.id.as_bytes());
    assert_eq!(
        n.version, ta,
        "the SET notification version is the holder's fencing token"
    );
    assert_lease_already_held(lease_b.acquire(Duration::from_secs(5), TIMEOUT, None).await);

    // The lease runs out without renewal: DELETE arrives promptly after 2.5 s.
    let d = next_notification(&mut obs, Duration::from_millis(2500 + 2000)).await;
    let elapsed = ms_since(acquired);
    assert_del_notification(&d, &name);
    assert!(
        elapsed >= 2300,
        "lease DELETE {elapsed} ms after a 2.5 s lease: too early"
    );
    assert_eq!(lease_b.get_holder(TIMEOUT).await.unwrap(), None);

    let tb = lease_b
        .acquire(Duration::from_secs(5), TIMEOUT, None)
        .await
        .expect("B acquires the expired lease");
    assert_later(&tb, &ta, "token after expiry");
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &name,
        b.id.as_bytes(),
    );
    assert!(lease_b.unobserve(TIMEOUT).await.unwrap());
    lease_b.release(TIMEOUT).await.unwrap();

    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_auto_renewal_keeps_it_held() {
    let server = Server::start("lease_auto_renewal_keeps_it_held");
    let a = AioClient::connect(&server, &client_id("leaserenew", "a")).await;
    let b = AioClient::connect(&server, &client_id("leaserenew", "b")).await;
    let name = b"lease/renewed".to_vec();
    let lease_a = lease_of(&a, &name);
    let lease_b = lease_of(&b, &name);

    let mut obs = lease_b.observe(TIMEOUT).await.unwrap();
    let t1 = lease_a
        .acquire(RENEWED_EXPIRY, TIMEOUT, Some(RENEWAL))
        .await
        .unwrap();

    // Well past the expiry, the lease is still A's thanks to renewals.
    tokio::time::sleep(RENEWED_EXPIRY + Duration::from_millis(1500)).await;
    assert_eq!(
        lease_b.get_holder(TIMEOUT).await.unwrap(),
        Some(a.id.clone().into_bytes())
    );
    assert_lease_already_held(lease_b.acquire(Duration::from_secs(5), TIMEOUT, None).await);
    let latest = lease_a
        .current_lease_fencing_token()
        .expect("A still holds a token");
    assert_later(&latest, &t1, "auto-renewed token");

    // The observer saw the initial SET and several renewal SETs, and no DELETE.
    let sets = between_renewals(&mut obs, &name, a.id.as_bytes()).await;
    assert!(
        sets >= 5,
        "expected the initial SET and at least 4 renewals, saw {sets} SET notifications"
    );

    lease_a.release(TIMEOUT).await.unwrap();
    assert_del_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &name,
    );
    // Renewal stopped with the release: nobody re-creates the lease.
    no_notification(&mut obs, Duration::from_millis(1200)).await;
    lease_b
        .acquire(Duration::from_secs(5), TIMEOUT, None)
        .await
        .expect("B acquires after release");
    lease_b.release(TIMEOUT).await.unwrap();
    assert!(lease_b.unobserve(TIMEOUT).await.unwrap());

    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_fencing_token_guards_protected_key() {
    let server = Server::start("lease_fencing_token_guards_protected_key");
    let a = AioClient::connect(&server, &client_id("leasefence", "a")).await;
    let b = AioClient::connect(&server, &client_id("leasefence", "b")).await;
    let name = b"lease/fence".to_vec();
    let protected = b"lease/fence/protected".to_vec();
    let lease_a = lease_of(&a, &name);
    let lease_b = lease_of(&b, &name);

    let ta = lease_a
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap();
    assert!(
        a.state_store
            .set(
                protected.clone(),
                b"by-a".to_vec(),
                TIMEOUT,
                Some(ta.clone()),
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );
    assert!(
        a.state_store
            .set(
                protected.clone(),
                b"by-a-2".to_vec(),
                TIMEOUT,
                Some(ta.clone()),
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );
    lease_a.release(TIMEOUT).await.unwrap();

    let tb = lease_b
        .acquire(Duration::from_secs(10), TIMEOUT, None)
        .await
        .unwrap();
    assert_later(&tb, &ta, "second holder's token");
    assert!(
        b.state_store
            .set(
                protected.clone(),
                b"by-b".to_vec(),
                TIMEOUT,
                Some(tb.clone()),
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );

    // The stale holder is fenced off.
    let e = a
        .state_store
        .set(
            protected.clone(),
            b"stale".to_vec(),
            TIMEOUT,
            Some(ta.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "stale SET: {e:?}"
    );
    let e = a
        .state_store
        .del(protected.clone(), Some(ta.clone()), TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "stale DEL: {e:?}"
    );
    let e = a
        .state_store
        .vdel(
            protected.clone(),
            b"by-b".to_vec(),
            Some(ta.clone()),
            TIMEOUT,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "stale VDEL: {e:?}"
    );
    let e = a
        .state_store
        .set(
            protected.clone(),
            b"none".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::MissingFencingToken),
        "SET without token: {e:?}"
    );
    assert_eq!(
        a.state_store
            .get(protected.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"by-b"[..])
    );

    // The current holder can delete it.
    assert_eq!(
        b.state_store
            .del(protected.clone(), Some(tb.clone()), TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    lease_b.release(TIMEOUT).await.unwrap();

    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waiter_acquires_after_release() {
    let server = Server::start("lock_waiter_acquires_after_release");
    let a = AioClient::connect(&server, &client_id("lockrel", "a")).await;
    let b = AioClient::connect(&server, &client_id("lockrel", "b")).await;
    let name = b"lock/released".to_vec();
    let protected = b"lock/released/data".to_vec();
    let lock_a = lock_of(&a, &name);
    let lock_b = lock_of(&b, &name);

    let ta = lock_a
        .lock(Duration::from_secs(20), TIMEOUT, None)
        .await
        .expect("A locks a free lock");
    assert_eq!(lock_a.current_lock_fencing_token().as_ref(), Some(&ta));
    assert!(
        a.state_store
            .set(
                protected.clone(),
                b"a".to_vec(),
                TIMEOUT,
                Some(ta.clone()),
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );

    let waiter = tokio::spawn({
        let lock_b = lock_b.clone();
        async move {
            let t = lock_b.lock(Duration::from_secs(20), TIMEOUT, None).await;
            (t, Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!waiter.is_finished(), "B got the lock while A holds it");
    assert_eq!(
        a.state_store
            .get(name.clone(), TIMEOUT)
            .await
            .unwrap()
            .response,
        Some(a.id.clone().into_bytes())
    );

    let released = Instant::now();
    lock_a.unlock(TIMEOUT).await.unwrap();
    let (tb, got_it) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("B did not get the lock within 5 s of A's unlock")
        .expect("waiter task");
    let tb = tb.expect("B's lock call failed");
    let wait_ms = got_it.duration_since(released).as_millis();
    assert!(
        wait_ms < 3000,
        "B took {wait_ms} ms to get the lock after the release"
    );
    assert_later(&tb, &ta, "B's lock token");
    assert_eq!(lock_b.current_lock_fencing_token().as_ref(), Some(&tb));
    assert_eq!(
        b.state_store
            .get(name.clone(), TIMEOUT)
            .await
            .unwrap()
            .response,
        Some(b.id.clone().into_bytes())
    );

    // B's token opens the protected key, A's no longer does.
    assert!(
        b.state_store
            .set(
                protected.clone(),
                b"b".to_vec(),
                TIMEOUT,
                Some(tb.clone()),
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );
    let e = a
        .state_store
        .set(
            protected.clone(),
            b"late".to_vec(),
            TIMEOUT,
            Some(ta.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "{e:?}"
    );

    lock_b.unlock(TIMEOUT).await.unwrap();
    assert_eq!(
        a.state_store
            .get(name.clone(), TIMEOUT)
            .await
            .unwrap()
            .response,
        None
    );

    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waiter_acquires_after_expiry() {
    let server = Server::start("lock_waiter_acquires_after_expiry");
    let a = AioClient::connect(&server, &client_id("lockexp", "a")).await;
    let b = AioClient::connect(&server, &client_id("lockexp", "b")).await;
    let name = b"lock/expiring".to_vec();
    let lock_a = lock_of(&a, &name);
    let lock_b = lock_of(&b, &name);

    let locked = Instant::now();
    let ta = lock_a
        .lock(Duration::from_millis(2000), TIMEOUT, None)
        .await
        .unwrap();
    // A never unlocks; only the expiry's DELETE notification can wake B.
    let waiter = tokio::spawn({
        let lock_b = lock_b.clone();
        async move {
            let t = lock_b.lock(Duration::from_secs(10), TIMEOUT, None).await;
            (t, Instant::now())
        }
    });
    let (tb, got_it) = tokio::time::timeout(Duration::from_millis(2000 + 3000), waiter)
        .await
        .expect("B was not woken by the lock's expiry within 3 s after it")
        .expect("waiter task");
    let tb = tb.expect("B's lock call failed");
    let after_ms = got_it.duration_since(locked).as_millis();
    assert!(
        after_ms >= 1800,
        "B got the lock {after_ms} ms after A's 2 s lock: too early"
    );
    assert_later(&tb, &ta, "B's token after expiry");
    assert_eq!(
        a.state_store
            .get(name.clone(), TIMEOUT)
            .await
            .unwrap()
            .response,
        Some(b.id.clone().into_bytes())
    );

    lock_b.unlock(TIMEOUT).await.unwrap();
    a.close().await;
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_auto_renewal_blocks_waiter_until_unlock() {
    let server = Server::start("lock_auto_renewal_blocks_waiter_until_unlock");
    let a = AioClient::connect(&server, &client_id("lockrenew", "a")).await;
    let b = AioClient::connect(&server, &client_id("lockrenew", "b")).await;
    let name = b"lock/renewed".to_vec();
    let lock_a = lock_of(&a, &name);
    let lock_b = lock_of(&b, &name);

    // A third session watches the lock's key, to time the unlock between renewals.
    let c = AioClient::connect(&server, &client_id("lockrenew", "c")).await;
    let watch = lease_of(&c, &name);
    let mut obs = watch.observe(TIMEOUT).await.unwrap();

    let ta = lock_a
        .lock(RENEWED_EXPIRY, TIMEOUT, Some(RENEWAL))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let lock_b = lock_b.clone();
        async move { lock_b.lock(Duration::from_secs(10), TIMEOUT, None).await }
    });
    // Past the expiry; renewals (successful SETs) do not wake B for good.
    tokio::time::sleep(RENEWED_EXPIRY + Duration::from_millis(1500)).await;
    assert!(
        !waiter.is_finished(),
        "B got the lock although A keeps renewing it"
    );
    let renewed = lock_a
        .current_lock_fencing_token()
        .expect("A still holds the lock");
    assert_later(&renewed, &ta, "auto-renewed lock token");
    let sets = between_renewals(&mut obs, &name, a.id.as_bytes()).await;
    assert!(
        sets >= 5,
        "the lock and at least 4 renewals, saw {sets} SETs"
    );
    let renewed = lock_a
        .current_lock_fencing_token()
        .expect("A still holds the lock");

    lock_a.unlock(TIMEOUT).await.unwrap();
    assert_del_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &name,
    );
    let tb = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("B did not get the lock within 5 s of the unlock")
        .expect("waiter task")
        .expect("B's lock call failed");
    assert_later(&tb, &renewed, "B's token after A's renewals");
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &name,
        b.id.as_bytes(),
    );
    lock_b.unlock(TIMEOUT).await.unwrap();
    assert!(watch.unobserve(TIMEOUT).await.unwrap());

    a.close().await;
    b.close().await;
    c.close().await;
}
