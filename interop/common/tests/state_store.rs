//! mqkv's state store driven by the official AIO Rust SDK `state_store::Client`.
//!
//! Shared by the `aio-stable` (1.3.0) and `aio-beta` (1.5.0-beta1) crates. Each test starts its
//! own server; expected behaviour is the one in shared/spec/aio-wire-compat.md sections 1-6.

#[path = "../support/mod.rs"]
mod support;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::state_store::{
    ErrorKind, ServiceError, SetCondition, SetOptions,
};

use support::*;

fn nx() -> SetOptions {
    SetOptions {
        set_condition: SetCondition::OnlyIfDoesNotExist,
        ..Default::default()
    }
}

fn nex() -> SetOptions {
    SetOptions {
        set_condition: SetCondition::OnlyIfEqualOrDoesNotExist,
        ..Default::default()
    }
}

fn px(ms: u64) -> SetOptions {
    SetOptions {
        expires: Some(Duration::from_millis(ms)),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// SET / GET / DEL / VDEL and versions
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_del_with_versions() {
    let server = Server::start("set_get_del_with_versions");
    let c = AioClient::connect(&server, &client_id("crud", "a")).await;
    let ss = &c.state_store;
    let key = b"crud/key".to_vec();

    // GET of a key that was never set: None and no version (GET miss carries no __ts).
    let miss = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(miss.response, None);
    assert!(
        miss.version.is_none(),
        "GET miss must not carry __ts, got {:?}",
        miss.version
    );

    let before_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let set1 = ss
        .set(
            key.clone(),
            b"v1".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set1.response, "plain SET of a new key must be applied");
    let v1 = set1
        .version
        .expect("SET +OK must carry the key version in __ts");
    assert!(
        hlc_ms(&v1) >= before_ms,
        "version {v1} is older than the wall clock before the request ({before_ms} ms)"
    );

    // GET returns the value and exactly the version of the SET that wrote it.
    let get1 = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(get1.response.as_deref(), Some(&b"v1"[..]));
    assert_eq!(
        get1.version.as_ref(),
        Some(&v1),
        "GET hit must return the SET version"
    );
    // Reading does not change the version.
    let get1b = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(get1b.version.as_ref(), Some(&v1));

    // Overwrite: new version strictly later, same server node id.
    let set2 = ss
        .set(
            key.clone(),
            b"v2".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set2.response);
    let v2 = set2.version.expect("SET must carry __ts");
    assert_later(&v2, &v1, "second SET of the key");
    assert_eq!(
        v2.node_id, v1.node_id,
        "server node id must be stable across versions"
    );
    let get2 = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(get2.response.as_deref(), Some(&b"v2"[..]));
    assert_eq!(get2.version.as_ref(), Some(&v2));

    // Many sequential writes: versions strictly increase.
    let mut last = v2;
    for i in 0..10 {
        let r = ss
            .set(
                key.clone(),
                format!("v{i}").into_bytes(),
                TIMEOUT,
                None,
                SetOptions::default(),
            )
            .await
            .unwrap();
        let v = r.version.expect("SET must carry __ts");
        assert_later(&v, &last, "sequential SET");
        last = v;
    }

    // Binary-safe value: CR, LF, NUL and RESP-looking bytes survive untouched.
    let tricky = b"\r\n$3\r\nSET\r\n\0\xff*2\r\n".to_vec();
    assert!(
        ss.set(
            key.clone(),
            tricky.clone(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_eq!(
        ss.get(key.clone(), TIMEOUT).await.unwrap().response,
        Some(tricky)
    );

    // DEL of an existing key: 1; then it is gone; DEL again: 0.
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        1
    );
    let gone = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(gone.response, None);
    assert!(
        gone.version.is_none(),
        "GET miss after DEL must not carry __ts"
    );
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        0
    );
    assert_eq!(
        ss.del(b"crud/never".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );

    // Re-creating the key after DEL gets a version later than every earlier one.
    let set3 = ss
        .set(
            key.clone(),
            b"v3".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set3.response);
    assert_later(set3.version.as_ref().unwrap(), &last, "SET after DEL");

    // SET with `aio-persistence: true` (persist option) is accepted like any other SET.
    let persisted = b"crud/persisted".to_vec();
    let opts = SetOptions {
        persist: true,
        ..Default::default()
    };
    assert!(
        ss.set(persisted.clone(), b"p".to_vec(), TIMEOUT, None, opts)
            .await
            .unwrap()
            .response
    );
    assert_eq!(
        ss.get(persisted.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"p"[..])
    );

    // Keys are independent.
    let other = b"crud/other".to_vec();
    assert!(
        ss.set(
            other.clone(),
            b"o".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"v3"[..])
    );
    assert_eq!(
        ss.get(other.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"o"[..])
    );

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vdel_compares_value() {
    let server = Server::start("vdel_compares_value");
    let c = AioClient::connect(&server, &client_id("vdel", "a")).await;
    let ss = &c.state_store;
    let key = b"vdel/key".to_vec();

    // Absent key: 0.
    assert_eq!(
        ss.vdel(key.clone(), b"x".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );

    assert!(
        ss.set(
            key.clone(),
            b"right".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );

    // Value mismatch: -1 and the key survives.
    assert_eq!(
        ss.vdel(key.clone(), b"wrong".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    // A prefix of the value is not equal to it either.
    assert_eq!(
        ss.vdel(key.clone(), b"righ".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    assert_eq!(
        ss.vdel(key.clone(), b"right!".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"right"[..])
    );

    // Match: 1 and the key is gone.
    assert_eq!(
        ss.vdel(key.clone(), b"right".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_eq!(ss.get(key.clone(), TIMEOUT).await.unwrap().response, None);
    assert_eq!(
        ss.vdel(key.clone(), b"right".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );

    c.close().await;
}

// ---------------------------------------------------------------------------------------------
// SET conditions
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_nx_only_if_absent() {
    let server = Server::start("set_nx_only_if_absent");
    let c = AioClient::connect(&server, &client_id("nx", "a")).await;
    let ss = &c.state_store;
    let key = b"nx/key".to_vec();

    let first = ss
        .set(key.clone(), b"first".to_vec(), TIMEOUT, None, nx())
        .await
        .unwrap();
    assert!(first.response, "NX on an absent key must be applied");
    let v_first = first.version.expect("SET +OK must carry __ts");

    // NX on an existing key: not applied (:-1), value kept, __ts = the stored version.
    let second = ss
        .set(key.clone(), b"second".to_vec(), TIMEOUT, None, nx())
        .await
        .unwrap();
    assert!(
        !second.response,
        "NX on an existing key must not be applied"
    );
    assert_eq!(
        second.version.as_ref(),
        Some(&v_first),
        "SET not applied must carry the stored version in __ts"
    );
    // NX with the same value is still "exists": not applied.
    let same = ss
        .set(key.clone(), b"first".to_vec(), TIMEOUT, None, nx())
        .await
        .unwrap();
    assert!(
        !same.response,
        "NX with an equal value on an existing key must not be applied"
    );
    let got = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(got.response.as_deref(), Some(&b"first"[..]));
    assert_eq!(
        got.version.as_ref(),
        Some(&v_first),
        "a refused NX must not bump the version"
    );

    // After DEL the key is absent again and NX applies.
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        1
    );
    let third = ss
        .set(key.clone(), b"third".to_vec(), TIMEOUT, None, nx())
        .await
        .unwrap();
    assert!(third.response);
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"third"[..])
    );

    // NX together with PX: applied and expires.
    let key2 = b"nx/px".to_vec();
    let opts = SetOptions {
        set_condition: SetCondition::OnlyIfDoesNotExist,
        expires: Some(Duration::from_millis(2000)),
        ..Default::default()
    };
    assert!(
        ss.set(key2.clone(), b"p".to_vec(), TIMEOUT, None, opts.clone())
            .await
            .unwrap()
            .response
    );
    assert!(
        !ss.set(key2.clone(), b"q".to_vec(), TIMEOUT, None, opts.clone())
            .await
            .unwrap()
            .response
    );
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(ss.get(key2.clone(), TIMEOUT).await.unwrap().response, None);
    assert!(
        ss.set(key2.clone(), b"r".to_vec(), TIMEOUT, None, opts)
            .await
            .unwrap()
            .response,
        "NX must apply again once the key expired"
    );

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_nex_if_equal_or_absent() {
    let server = Server::start("set_nex_if_equal_or_absent");
    let c = AioClient::connect(&server, &client_id("nex", "a")).await;
    let ss = &c.state_store;
    let key = b"nex/key".to_vec();

    // Absent: applied.
    let r1 = ss
        .set(key.clone(), b"holder-1".to_vec(), TIMEOUT, None, nex())
        .await
        .unwrap();
    assert!(r1.response, "NEX on an absent key must be applied");
    let v1 = r1.version.unwrap();

    // Equal value: applied again, with a new, later version.
    let r2 = ss
        .set(key.clone(), b"holder-1".to_vec(), TIMEOUT, None, nex())
        .await
        .unwrap();
    assert!(r2.response, "NEX with an equal value must be applied");
    let v2 = r2.version.expect("SET +OK must carry __ts");
    assert_later(&v2, &v1, "NEX rewrite of an equal value");

    // Different value: not applied, stored version in __ts, value unchanged.
    let r3 = ss
        .set(key.clone(), b"holder-2".to_vec(), TIMEOUT, None, nex())
        .await
        .unwrap();
    assert!(
        !r3.response,
        "NEX with a different value must not be applied"
    );
    assert_eq!(
        r3.version.as_ref(),
        Some(&v2),
        "SET not applied must carry the stored version"
    );
    let got = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(got.response.as_deref(), Some(&b"holder-1"[..]));
    assert_eq!(got.version.as_ref(), Some(&v2));

    // An unconditional SET still overwrites.
    assert!(
        ss.set(
            key.clone(),
            b"holder-2".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert!(
        ss.set(key.clone(), b"holder-2".to_vec(), TIMEOUT, None, nex())
            .await
            .unwrap()
            .response
    );
    assert!(
        !ss.set(key.clone(), b"holder-1".to_vec(), TIMEOUT, None, nex())
            .await
            .unwrap()
            .response
    );

    c.close().await;
}

// ---------------------------------------------------------------------------------------------
// Expiry
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn px_expiry_removes_key() {
    let server = Server::start("px_expiry_removes_key");
    let c = AioClient::connect(&server, &client_id("px", "a")).await;
    let ss = &c.state_store;
    let key = b"px/key".to_vec();
    let forever = b"px/forever".to_vec();

    assert!(
        ss.set(key.clone(), b"short".to_vec(), TIMEOUT, None, px(2000))
            .await
            .unwrap()
            .response
    );
    assert!(
        ss.set(forever.clone(), b"long".to_vec(), TIMEOUT, None, px(60_000))
            .await
            .unwrap()
            .response
    );
    // Still there well before expiry.
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"short"[..])
    );

    tokio::time::sleep(Duration::from_millis(3000)).await;
    let after = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(
        after.response, None,
        "key set with PX 2000 must be gone after 3 s"
    );
    assert!(
        after.version.is_none(),
        "GET of an expired key must not carry __ts"
    );
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        0,
        "expired key must not be deletable"
    );
    assert_eq!(
        ss.vdel(key.clone(), b"short".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );
    assert_eq!(
        ss.get(forever.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"long"[..])
    );

    // Re-setting with a new PX extends the lifetime (what lease renewal relies on).
    let renew = b"px/renew".to_vec();
    assert!(
        ss.set(renew.clone(), b"r".to_vec(), TIMEOUT, None, px(2000))
            .await
            .unwrap()
            .response
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        ss.set(renew.clone(), b"r".to_vec(), TIMEOUT, None, px(3000))
            .await
            .unwrap()
            .response
    );
    // Past the first expiry, before the second.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert_eq!(
        ss.get(renew.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"r"[..]),
        "a re-SET with a new PX must replace the old expiry"
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(ss.get(renew.clone(), TIMEOUT).await.unwrap().response, None);

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn px_expiry_notifies_observer_promptly() {
    let server = Server::start("px_expiry_notifies_observer_promptly");
    let watcher = AioClient::connect(&server, &client_id("pxnotify", "watcher")).await;
    let writer = AioClient::connect(&server, &client_id("pxnotify", "writer")).await;
    let key = b"pxnotify/key".to_vec();

    let mut obs = watcher
        .state_store
        .observe(key.clone(), TIMEOUT)
        .await
        .unwrap()
        .response;
    let sent = Instant::now();
    let set = writer
        .state_store
        .set(key.clone(), b"ephemeral".to_vec(), TIMEOUT, None, px(1000))
        .await
        .unwrap();
    assert!(set.response);
    let set_version = set.version.unwrap();

    let n = next_notification(&mut obs, Duration::from_secs(5)).await;
    assert_set_notification(&n, &key, b"ephemeral");
    assert_eq!(
        n.version, set_version,
        "SET notification must carry the new key version"
    );

    // Nobody touches the key: the DELETE must come from the server's own expiry timer,
    // no earlier than the PX and within 1.5 s after it.
    let d = next_notification(&mut obs, Duration::from_millis(1000 + 1500)).await;
    let elapsed = ms_since(sent);
    assert_del_notification(&d, &key);
    assert!(
        elapsed >= 900,
        "DELETE notification {elapsed} ms after a PX 1000 SET: too early"
    );
    assert_later(
        &d.version,
        &set_version,
        "DELETE notification version after the SET",
    );

    assert_eq!(
        watcher
            .state_store
            .get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response,
        None
    );
    // Exactly one DELETE.
    no_notification(&mut obs, Duration::from_millis(800)).await;

    assert!(
        watcher
            .state_store
            .unobserve(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
    );
    writer.close().await;
    watcher.close().await;
}

// ---------------------------------------------------------------------------------------------
// Observe / unobserve and notifications
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_set_and_delete_notifications() {
    let server = Server::start("observe_set_and_delete_notifications");
    let c = AioClient::connect(&server, &client_id("observe", "a")).await;
    let ss = &c.state_store;
    let key = b"observe/key".to_vec();

    // Observing a key that does not exist is fine.
    let mut obs = ss.observe(key.clone(), TIMEOUT).await.unwrap().response;

    let s1 = ss
        .set(
            key.clone(),
            b"one".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    let n1 = next_notification(&mut obs, Duration::from_secs(5)).await;
    assert_set_notification(&n1, &key, b"one");
    assert_eq!(
        Some(&n1.version),
        s1.version.as_ref(),
        "SET notification version = SET __ts"
    );

    let s2 = ss
        .set(
            key.clone(),
            b"two".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    let n2 = next_notification(&mut obs, Duration::from_secs(5)).await;
    assert_set_notification(&n2, &key, b"two");
    assert_eq!(Some(&n2.version), s2.version.as_ref());

    // A SET that is not applied produces no notification.
    assert!(
        !ss.set(key.clone(), b"three".to_vec(), TIMEOUT, None, nx())
            .await
            .unwrap()
            .response
    );
    assert!(
        !ss.set(key.clone(), b"three".to_vec(), TIMEOUT, None, nex())
            .await
            .unwrap()
            .response
    );
    // A VDEL mismatch produces no notification.
    assert_eq!(
        ss.vdel(key.clone(), b"nope".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    no_notification(&mut obs, Duration::from_millis(800)).await;

    // NEX rewrite of the same value is a successful SET: notified.
    assert!(
        ss.set(key.clone(), b"two".to_vec(), TIMEOUT, None, nex())
            .await
            .unwrap()
            .response
    );
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        b"two",
    );

    // DEL: DELETE notification with a version later than the last write.
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        1
    );
    let d = next_notification(&mut obs, Duration::from_secs(5)).await;
    assert_del_notification(&d, &key);
    assert_later(
        &d.version,
        s2.version.as_ref().unwrap(),
        "DELETE notification version",
    );

    // DEL / VDEL of an absent key: no notification.
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        0
    );
    assert_eq!(
        ss.vdel(key.clone(), b"x".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );
    no_notification(&mut obs, Duration::from_millis(800)).await;

    // The observation outlives the key's deletion: re-create, VDEL, both notified.
    assert!(
        ss.set(
            key.clone(),
            b"again".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        b"again",
    );
    assert_eq!(
        ss.vdel(key.clone(), b"again".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_del_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
    );

    // Writes to other keys are not delivered on this observation.
    assert!(
        ss.set(
            b"observe/other".to_vec(),
            b"z".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    no_notification(&mut obs, Duration::from_millis(800)).await;

    // The notification caused by a write is published before the write's response: a
    // notification must already be queued when unobserve is called right after the SET.
    assert!(
        ss.set(
            key.clone(),
            b"last".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert!(
        ss.unobserve(key.clone(), TIMEOUT).await.unwrap().response,
        "unobserve of an observed key"
    );
    match tokio::time::timeout(Duration::from_secs(2), obs.recv_notification()).await {
        Ok(Some((n, _))) => assert_set_notification(&n, &key, b"last"),
        Ok(None) => panic!("SET notification was not delivered before the SET response"),
        Err(_) => panic!("observation neither delivered the SET nor closed after unobserve"),
    }
    // ... and the observation ends after unobserve.
    match tokio::time::timeout(Duration::from_secs(2), obs.recv_notification()).await {
        Ok(None) => {}
        Ok(Some((n, _))) => panic!("notification after unobserve: {n}"),
        Err(_) => panic!("observation channel not closed after unobserve"),
    }

    // Unobserving again: the key is no longer observed, so false (server answers :0).
    assert!(!ss.unobserve(key.clone(), TIMEOUT).await.unwrap().response);
    // A key that was never observed: false.
    assert!(
        !ss.unobserve(b"observe/never".to_vec(), TIMEOUT)
            .await
            .unwrap()
            .response
    );

    // Observe again after unobserve: works and notifies.
    let mut obs2 = ss.observe(key.clone(), TIMEOUT).await.unwrap().response;
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        1
    );
    assert_del_notification(
        &next_notification(&mut obs2, Duration::from_secs(5)).await,
        &key,
    );
    assert!(ss.unobserve(key.clone(), TIMEOUT).await.unwrap().response);

    c.close().await;
}

/// Raw wire check of notifications (topic, payload bytes, properties), and that the server
/// stops publishing once KEYNOTIFY STOP was answered. The SDK drops malformed notifications
/// silently, so this looks at the MQTT publishes themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notification_wire_form_and_stop() {
    let server = Server::start("notification_wire_form_and_stop");
    let c = AioClient::connect(&server, &client_id("wire", "a")).await;
    let ss = &c.state_store;
    let mut tap = NotificationTap::attach(&c).await;
    let key = b"wire/K\x00\xfe".to_vec();
    let expected_topic = format!(
        "{NOTIFY_PREFIX}{}/command/notify/{}",
        hex_upper(c.id.as_bytes()),
        hex_upper(&key)
    );

    let mut obs = ss.observe(key.clone(), TIMEOUT).await.unwrap().response;
    // Writes to keys this client does not observe reach nobody.
    assert!(
        ss.set(
            b"wire/unobserved".to_vec(),
            b"x".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    tap.silent(Duration::from_millis(800)).await;

    let s = ss
        .set(
            key.clone(),
            b"abc".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    let p = tap.next(Duration::from_secs(5)).await;
    assert_eq!(p.topic_name.as_str(), expected_topic, "notification topic");
    assert_eq!(
        &p.payload[..],
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n"
    );
    assert!(
        is_qos1(&p),
        "notifications should be QoS 1, got {:?}",
        p.qos
    );
    assert!(!p.retain, "notifications must not be retained");
    assert!(
        matches!(
            p.properties.content_type.as_deref(),
            None | Some("application/octet-stream")
        ),
        "content type {:?}",
        p.properties.content_type
    );
    assert!(
        p.properties.correlation_data.is_none(),
        "notifications must not carry correlation data"
    );
    let ts: HybridLogicalClock = user_property(&p, "__ts")
        .expect("notification without __ts")
        .parse()
        .expect("notification __ts must parse");
    assert_eq!(
        Some(&ts),
        s.version.as_ref(),
        "SET notification __ts = SET response __ts"
    );
    if let Some(v) = user_property(&p, "__protVer") {
        assert!(v.starts_with("1."), "__protVer {v}");
    }
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        b"abc",
    );

    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        1
    );
    let p = tap.next(Duration::from_secs(5)).await;
    assert_eq!(p.topic_name.as_str(), expected_topic);
    assert_eq!(&p.payload[..], b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
    assert!(
        user_property(&p, "__ts").is_some(),
        "DELETE notification without __ts"
    );
    assert_del_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
    );

    // After STOP is answered, nothing more is published for this (client, key).
    assert!(ss.unobserve(key.clone(), TIMEOUT).await.unwrap().response);
    assert!(
        ss.set(key.clone(), b"after".to_vec(), TIMEOUT, None, px(5_000))
            .await
            .unwrap()
            .response
    );
    assert_eq!(
        ss.vdel(key.clone(), b"after".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert!(
        ss.set(key.clone(), b"expiring".to_vec(), TIMEOUT, None, px(300))
            .await
            .unwrap()
            .response
    );
    tap.silent(Duration::from_millis(1500)).await;

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_for_other_clients_writes() {
    let server = Server::start("notifications_for_other_clients_writes");
    let a = AioClient::connect(&server, &client_id("multi", "a")).await;
    let b = AioClient::connect(&server, &client_id("multi", "b")).await;
    let key = b"multi/shared".to_vec();

    let mut obs_a = a
        .state_store
        .observe(key.clone(), TIMEOUT)
        .await
        .unwrap()
        .response;

    // B writes, A (observer) is told.
    let sb = b
        .state_store
        .set(
            key.clone(),
            b"from-b".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    let n = next_notification(&mut obs_a, Duration::from_secs(5)).await;
    assert_set_notification(&n, &key, b"from-b");
    assert_eq!(Some(&n.version), sb.version.as_ref());

    // Both observe; a write by A reaches both, exactly once each.
    let mut obs_b = b
        .state_store
        .observe(key.clone(), TIMEOUT)
        .await
        .unwrap()
        .response;
    assert!(
        a.state_store
            .set(
                key.clone(),
                b"from-a".to_vec(),
                TIMEOUT,
                None,
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );
    assert_set_notification(
        &next_notification(&mut obs_a, Duration::from_secs(5)).await,
        &key,
        b"from-a",
    );
    assert_set_notification(
        &next_notification(&mut obs_b, Duration::from_secs(5)).await,
        &key,
        b"from-a",
    );

    // B deletes: both get DELETE.
    assert_eq!(
        b.state_store
            .del(key.clone(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_del_notification(
        &next_notification(&mut obs_a, Duration::from_secs(5)).await,
        &key,
    );
    assert_del_notification(
        &next_notification(&mut obs_b, Duration::from_secs(5)).await,
        &key,
    );
    no_notification(&mut obs_a, Duration::from_millis(500)).await;
    no_notification(&mut obs_b, Duration::from_millis(500)).await;

    // A stops observing; B still gets notified, A's unobserve does not affect B.
    assert!(
        a.state_store
            .unobserve(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
    );
    assert!(
        a.state_store
            .set(
                key.clone(),
                b"again".to_vec(),
                TIMEOUT,
                None,
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );
    assert_set_notification(
        &next_notification(&mut obs_b, Duration::from_secs(5)).await,
        &key,
        b"again",
    );

    // B's key expires: B is told.
    assert!(
        a.state_store
            .set(key.clone(), b"expiring".to_vec(), TIMEOUT, None, px(500))
            .await
            .unwrap()
            .response
    );
    assert_set_notification(
        &next_notification(&mut obs_b, Duration::from_secs(5)).await,
        &key,
        b"expiring",
    );
    assert_del_notification(
        &next_notification(&mut obs_b, Duration::from_secs(3)).await,
        &key,
    );

    assert!(
        b.state_store
            .unobserve(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
    );
    a.close().await;
    b.close().await;
}

/// KEYNOTIFY repeated by the same MQTT client for the same key is answered +OK, registers the
/// client once (one notification per change), and one STOP ends it for that client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_keynotify_same_client() {
    let server = Server::start("repeated_keynotify_same_client");
    let c = AioClient::connect_with_extra(&server, &client_id("repeat", "a"), 1).await;
    let first = &c.state_store;
    let second = &c.extra[0];
    let key = b"repeat/key".to_vec();

    let mut obs1 = first.observe(key.clone(), TIMEOUT).await.unwrap().response;
    // Same MQTT client id, same key: the second KEYNOTIFY must be +OK too.
    let mut obs2 = second
        .observe(key.clone(), TIMEOUT)
        .await
        .expect("repeated KEYNOTIFY from the same client must be answered +OK")
        .response;

    assert!(
        first
            .set(
                key.clone(),
                b"v".to_vec(),
                TIMEOUT,
                None,
                SetOptions::default()
            )
            .await
            .unwrap()
            .response
    );
    assert_set_notification(
        &next_notification(&mut obs1, Duration::from_secs(5)).await,
        &key,
        b"v",
    );
    assert_set_notification(
        &next_notification(&mut obs2, Duration::from_secs(5)).await,
        &key,
        b"v",
    );
    // One registration, one publish: both SDK clients on the session see it once only.
    no_notification(&mut obs1, Duration::from_millis(800)).await;
    no_notification(&mut obs2, Duration::from_millis(200)).await;

    // STOP from the session ends the (client, key) registration; a second STOP finds nothing.
    assert!(
        first
            .unobserve(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
    );
    assert!(
        !second
            .unobserve(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response,
        "second STOP for the same client and key must be answered :0"
    );

    c.close().await;
}

// ---------------------------------------------------------------------------------------------
// Fencing tokens
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_protect_keys() {
    let server = Server::start("fencing_tokens_protect_keys");
    let c = AioClient::connect(&server, &client_id("fence", "a")).await;
    let ss = &c.state_store;
    let key = b"fence/key".to_vec();
    let node = "fence-test-node";

    // A new key set with a fencing token becomes protected by it.
    let t1 = hlc_at_offset(-5_000, node);
    assert!(
        ss.set(
            key.clone(),
            b"v1".to_vec(),
            TIMEOUT,
            Some(t1.clone()),
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );

    // GET needs no token.
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"v1"[..])
    );

    // Missing token on SET / DEL / VDEL.
    let e = ss
        .set(
            key.clone(),
            b"x".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::MissingFencingToken),
        "SET without __ft: {e:?}"
    );
    let e = ss.del(key.clone(), None, TIMEOUT).await.unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::MissingFencingToken),
        "DEL without __ft: {e:?}"
    );
    let e = ss
        .vdel(key.clone(), b"v1".to_vec(), None, TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::MissingFencingToken),
        "VDEL without __ft: {e:?}"
    );

    // Lower token on SET / DEL / VDEL.
    let lower = hlc_at_offset(-10_000, node);
    let e = ss
        .set(
            key.clone(),
            b"x".to_vec(),
            TIMEOUT,
            Some(lower.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "SET with lower __ft: {e:?}"
    );
    let e = ss
        .del(key.clone(), Some(lower.clone()), TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "DEL with lower __ft: {e:?}"
    );
    let e = ss
        .vdel(key.clone(), b"v1".to_vec(), Some(lower.clone()), TIMEOUT)
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "VDEL with lower __ft: {e:?}"
    );

    // Same timestamp, lower counter is lower too; the all-zero HLC is well-formed and lower.
    let mut t1_plus = t1.clone();
    t1_plus.counter = 3;
    assert!(
        ss.set(
            key.clone(),
            b"v1c".to_vec(),
            TIMEOUT,
            Some(t1_plus.clone()),
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    let e = ss
        .set(
            key.clone(),
            b"x".to_vec(),
            TIMEOUT,
            Some(t1.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "lower counter: {e:?}"
    );
    let e = ss
        .set(
            key.clone(),
            b"x".to_vec(),
            TIMEOUT,
            Some(hlc_zero(node)),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "all-zero __ft: {e:?}"
    );

    // The rejected writes changed nothing.
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"v1c"[..])
    );

    // Equal token: accepted. Higher token: accepted and becomes the new floor.
    assert!(
        ss.set(
            key.clone(),
            b"v2".to_vec(),
            TIMEOUT,
            Some(t1_plus.clone()),
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    let t2 = hlc_at_offset(-1_000, node);
    assert!(
        ss.set(
            key.clone(),
            b"v3".to_vec(),
            TIMEOUT,
            Some(t2.clone()),
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    let e = ss
        .set(
            key.clone(),
            b"x".to_vec(),
            TIMEOUT,
            Some(t1_plus.clone()),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenLowerVersion),
        "token below new floor: {e:?}"
    );

    // Conditions still apply after the fence check: NX on the existing key is not applied.
    assert!(
        !ss.set(key.clone(), b"x".to_vec(), TIMEOUT, Some(t2.clone()), nx())
            .await
            .unwrap()
            .response
    );
    // VDEL with a valid token and the wrong value: -1.
    assert_eq!(
        ss.vdel(key.clone(), b"wrong".to_vec(), Some(t2.clone()), TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    // A fencing token far in the future is refused as skewed.
    let future = hlc_at_offset(10 * 60 * 1000, node);
    let e = ss
        .set(
            key.clone(),
            b"x".to_vec(),
            TIMEOUT,
            Some(future),
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::FencingTokenSkew),
        "__ft 10 min ahead: {e:?}"
    );
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"v3"[..])
    );

    // DEL with a valid token works and discards the token: the key is unprotected afterwards.
    assert_eq!(
        ss.del(key.clone(), Some(t2.clone()), TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert!(
        ss.set(
            key.clone(),
            b"free".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        1
    );

    // DEL / VDEL with a token on an absent key: 0.
    assert_eq!(
        ss.del(key.clone(), Some(t2.clone()), TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );
    assert_eq!(
        ss.vdel(key.clone(), b"x".to_vec(), Some(t2.clone()), TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );

    // An existing unprotected key becomes protected by a SET carrying a token.
    let key2 = b"fence/upgrade".to_vec();
    assert!(
        ss.set(
            key2.clone(),
            b"plain".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    let t3 = hlc_at_offset(-2_000, node);
    assert!(
        ss.set(
            key2.clone(),
            b"fenced".to_vec(),
            TIMEOUT,
            Some(t3.clone()),
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    let e = ss
        .set(
            key2.clone(),
            b"x".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(service_error(&e), ServiceError::MissingFencingToken),
        "upgraded key, no __ft: {e:?}"
    );
    // VDEL with a valid token and the right value deletes.
    assert_eq!(
        ss.vdel(key2.clone(), b"fenced".to_vec(), Some(t3.clone()), TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );

    // An expired key loses its token too.
    let key3 = b"fence/expiring".to_vec();
    assert!(
        ss.set(
            key3.clone(),
            b"e".to_vec(),
            TIMEOUT,
            Some(t3.clone()),
            px(400)
        )
        .await
        .unwrap()
        .response
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        ss.set(
            key3.clone(),
            b"after".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response,
        "an expired fenced key must not keep its fencing token"
    );

    c.close().await;
}

// ---------------------------------------------------------------------------------------------
// Sizes
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_values() {
    let server = Server::start("empty_values");
    let c = AioClient::connect(&server, &client_id("empty", "a")).await;
    let ss = &c.state_store;
    let key = b"empty/key".to_vec();

    let mut obs = ss.observe(key.clone(), TIMEOUT).await.unwrap().response;
    let s = ss
        .set(
            key.clone(),
            Vec::new(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(s.response, "SET with an empty value must be applied");
    let got = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(
        got.response,
        Some(Vec::new()),
        "empty value must read back as empty, not as missing"
    );
    assert_eq!(got.version, s.version);
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        b"",
    );

    // NX sees the empty-valued key as existing; NEX compares with the empty value.
    assert!(
        !ss.set(key.clone(), b"x".to_vec(), TIMEOUT, None, nx())
            .await
            .unwrap()
            .response
    );
    assert!(
        ss.set(key.clone(), Vec::new(), TIMEOUT, None, nex())
            .await
            .unwrap()
            .response
    );
    assert!(
        !ss.set(key.clone(), b"x".to_vec(), TIMEOUT, None, nex())
            .await
            .unwrap()
            .response
    );
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        b"",
    );

    // Overwrite a non-empty value with an empty one.
    assert!(
        ss.set(
            key.clone(),
            b"full".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        b"full",
    );
    assert_eq!(
        ss.vdel(key.clone(), Vec::new(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    assert!(
        ss.set(
            key.clone(),
            Vec::new(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        b"",
    );

    // VDEL with the empty value deletes it.
    assert_eq!(
        ss.vdel(key.clone(), b"full".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    assert_eq!(
        ss.vdel(key.clone(), Vec::new(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_del_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
    );
    assert_eq!(ss.get(key.clone(), TIMEOUT).await.unwrap().response, None);

    assert!(ss.unobserve(key.clone(), TIMEOUT).await.unwrap().response);
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_values_and_keys() {
    let server = Server::start("large_values_and_keys");
    let c = AioClient::connect(&server, &client_id("large", "a")).await;
    let ss = &c.state_store;

    // 65,000-byte value with every byte value in it.
    let big_value: Vec<u8> = (0..65_000u32).map(|i| (i % 256) as u8).collect();
    let key = b"large/value".to_vec();
    let mut obs = ss.observe(key.clone(), TIMEOUT).await.unwrap().response;
    assert!(
        ss.set(
            key.clone(),
            big_value.clone(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_ref(),
        Some(&big_value)
    );
    assert_set_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
        &big_value,
    );
    assert_eq!(
        ss.vdel(key.clone(), big_value.clone(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_del_notification(
        &next_notification(&mut obs, Duration::from_secs(5)).await,
        &key,
    );
    assert!(ss.unobserve(key.clone(), TIMEOUT).await.unwrap().response);

    // 6,500-byte all-NUL key.
    let nul_key = vec![0u8; 6_500];
    assert!(
        ss.set(
            nul_key.clone(),
            b"nul".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_eq!(
        ss.get(nul_key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"nul"[..])
    );
    // A key one byte shorter is a different key.
    assert_eq!(
        ss.get(vec![0u8; 6_499], TIMEOUT).await.unwrap().response,
        None
    );

    // 6,500-byte binary key with a 65,000-byte value, observed (13,000 hex chars of topic).
    let bin_key: Vec<u8> = (0..6_500u32).map(|i| (i * 7 % 256) as u8).collect();
    let mut obs2 = ss.observe(bin_key.clone(), TIMEOUT).await.unwrap().response;
    assert!(
        ss.set(bin_key.clone(), big_value.clone(), TIMEOUT, None, nx())
            .await
            .unwrap()
            .response
    );
    let n = next_notification(&mut obs2, Duration::from_secs(5)).await;
    assert_set_notification(&n, &bin_key, &big_value);
    assert_eq!(
        ss.get(bin_key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_ref(),
        Some(&big_value)
    );
    assert!(
        ss.set(bin_key.clone(), big_value.clone(), TIMEOUT, None, nex())
            .await
            .unwrap()
            .response
    );
    assert_set_notification(
        &next_notification(&mut obs2, Duration::from_secs(5)).await,
        &bin_key,
        &big_value,
    );
    assert_eq!(
        ss.del(bin_key.clone(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_del_notification(
        &next_notification(&mut obs2, Duration::from_secs(5)).await,
        &bin_key,
    );
    assert!(
        ss.unobserve(bin_key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
    );

    assert_eq!(
        ss.del(nul_key.clone(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_eq!(ss.get(nul_key, TIMEOUT).await.unwrap().response, None);

    c.close().await;
}

/// The client refuses empty keys itself; the server never sees them. Kept so a change in the
/// SDK's behaviour is noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_key_rejected_by_client() {
    let server = Server::start("empty_key_rejected_by_client");
    let c = AioClient::connect(&server, &client_id("emptykey", "a")).await;
    let e = c.state_store.get(Vec::new(), TIMEOUT).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidArgument(_)), "{e:?}");
    c.close().await;
}

// ---------------------------------------------------------------------------------------------
// Many calls in flight through one client
// ---------------------------------------------------------------------------------------------

/// An application making concurrent calls through one client: the requests share one MQTT
/// connection, all in flight at once. Every call gets its own answer, every write its own
/// version, reads see the writes, and of racing `SET NX` calls exactly one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_through_one_client() {
    const N: usize = 100;
    let server = Server::start("concurrent_calls_through_one_client");
    let c = AioClient::connect(&server, &client_id("concurrent", "a")).await;
    let key = |i: usize| format!("concurrent/{i}").into_bytes();
    let value = |i: usize| format!("value-{i}").into_bytes();

    let mut sets = tokio::task::JoinSet::new();
    for i in 0..N {
        let ss = c.state_store.clone();
        sets.spawn(async move {
            let r = ss
                .set(key(i), value(i), TIMEOUT, None, SetOptions::default())
                .await;
            (i, r)
        });
    }
    let mut versions = vec![None; N];
    while let Some(joined) = sets.join_next().await {
        let (i, r) = joined.expect("SET task");
        let r = r.unwrap_or_else(|e| panic!("SET {i}: {e:?}"));
        assert!(r.response, "SET {i} applied");
        versions[i] = Some(format!("{:?}", r.version.expect("a SET answer has a version")));
    }
    let distinct: std::collections::HashSet<_> = versions.iter().flatten().collect();
    assert_eq!(distinct.len(), N, "every write has a version of its own");

    let mut gets = tokio::task::JoinSet::new();
    for i in 0..N {
        let ss = c.state_store.clone();
        gets.spawn(async move { (i, ss.get(key(i), TIMEOUT).await) });
    }
    while let Some(joined) = gets.join_next().await {
        let (i, r) = joined.expect("GET task");
        let r = r.unwrap_or_else(|e| panic!("GET {i}: {e:?}"));
        assert_eq!(r.response, Some(value(i)), "GET {i}");
        assert_eq!(
            r.version.map(|v| format!("{v:?}")),
            versions[i],
            "GET {i} reads the version its SET answered"
        );
    }

    let mut racers = tokio::task::JoinSet::new();
    for i in 0..N {
        let ss = c.state_store.clone();
        racers.spawn(async move {
            ss.set(
                b"concurrent/race".to_vec(),
                value(i),
                TIMEOUT,
                None,
                nx(),
            )
            .await
            .map(|r| r.response)
        });
    }
    let mut won = 0;
    while let Some(joined) = racers.join_next().await {
        if joined.expect("SET NX task").expect("SET NX answered") {
            won += 1;
        }
    }
    assert_eq!(won, 1, "exactly one of {N} racing SET NX calls is applied");
    c.close().await;
}
