//! Expiry.

use super::*;

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
