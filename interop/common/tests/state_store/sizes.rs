//! Sizes.

use super::*;

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
