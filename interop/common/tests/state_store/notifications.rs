//! Observe / unobserve and notifications.

use super::*;

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
