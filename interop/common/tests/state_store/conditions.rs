//! SET conditions.

use super::*;

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
