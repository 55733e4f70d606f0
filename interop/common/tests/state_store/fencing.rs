//! Fencing tokens.

use super::*;

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
