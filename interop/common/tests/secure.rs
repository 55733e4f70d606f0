//! The official AIO Rust SDK on secured servers: the state store's operations and key
//! notifications over mutual TLS, with a user name and password from a password file, and with
//! a service account token that is renewed while connected.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use azure_iot_operations_services::state_store::{ServiceError, SetOptions};

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_store_over_mutual_tls() {
    let server = Server::start_tls("state_store_over_mutual_tls");
    let c = AioClient::connect(&server, &client_id("tls", "a")).await;
    let ss = &c.state_store;
    let key = b"tls/key".to_vec();

    let set = ss
        .set(
            key.clone(),
            b"v1".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .expect("SET over TLS");
    assert!(set.response, "SET answered false");
    let v1 = set.version.expect("SET carries a version");
    let got = ss.get(key.clone(), TIMEOUT).await.expect("GET over TLS");
    assert_eq!(got.response, Some(b"v1".to_vec()));

    // A second client over TLS observes the key and hears of the change.
    let watcher = AioClient::connect(&server, &client_id("tls", "watcher")).await;
    let mut observation = watcher
        .state_store
        .observe(key.clone(), TIMEOUT)
        .await
        .expect("observe over TLS")
        .response;
    let set2 = ss
        .set(
            key.clone(),
            b"v2".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .expect("second SET");
    assert_later(&set2.version.expect("version"), &v1, "second SET");
    let n = next_notification(&mut observation, Duration::from_secs(10)).await;
    assert_set_notification(&n, &key, b"v2");

    let del = ss
        .del(key.clone(), None, TIMEOUT)
        .await
        .expect("DEL over TLS");
    assert_eq!(del.response, 1);
    assert_eq!(ss.get(key, TIMEOUT).await.expect("GET").response, None);
    watcher.close().await;
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_store_with_a_user_name_and_password() {
    let server = Server::start_with_password("state_store_with_a_user_name_and_password");
    let c = AioClient::connect(&server, &client_id("passwd", "a")).await;
    let ss = &c.state_store;
    let set = ss
        .set(
            b"passwd/key".to_vec(),
            b"v".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .expect("SET as user app");
    assert!(set.response);
    let got = ss.get(b"passwd/key".to_vec(), TIMEOUT).await.expect("GET");
    assert_eq!(got.response, Some(b"v".to_vec()));
    c.close().await;
}

/// An application configured as for an AIO cluster's default listener: a service account
/// token file, which the SDK sends with `K8S-SAT` and sends again (AUTH, re-authentication)
/// when the file changes. The policy gives the service account its own keys only; the
/// connection outlives the first token because the SDK renewed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_store_with_a_rotating_service_account_token() {
    let first_lifetime = Duration::from_secs(20);
    let started = std::time::Instant::now();
    let server = Server::start_with_tokens(
        "state_store_with_a_rotating_service_account_token",
        first_lifetime,
    );
    let c = AioClient::connect(&server, &client_id("sat", "a")).await;
    let ss = &c.state_store;
    let set = |key: &'static [u8], value: &'static [u8]| {
        ss.set(
            key.to_vec(),
            value.to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
    };
    assert!(set(b"app/k", b"v1").await.expect("own key").response);
    let denied = set(b"other/k", b"v1")
        .await
        .expect_err("another account's key");
    assert!(
        matches!(service_error(&denied), ServiceError::NotAuthorized),
        "{denied:?}"
    );

    // The token is rotated; the SDK notices (after its 10 s aggregation window) and
    // re-authenticates on the open connection.
    server.write_token("app", Duration::from_secs(600));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !server.log().contains("re-authenticated") {
        assert!(
            std::time::Instant::now() < deadline,
            "no re-authentication; log: {}",
            server.log_path.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Past the first token's expiry, the same connection still works.
    let past_expiry = first_lifetime + Duration::from_secs(2);
    if let Some(left) = past_expiry.checked_sub(started.elapsed()) {
        tokio::time::sleep(left).await;
    }
    assert!(set(b"app/k", b"v2").await.expect("after renewal").response);
    let got = ss.get(b"app/k".to_vec(), TIMEOUT).await.expect("GET");
    assert_eq!(got.response, Some(b"v2".to_vec()));
    let log = server.log();
    assert!(!log.contains("credential expired"), "the connection lapsed");
    assert_eq!(
        log.matches("client connected").count(),
        1,
        "the SDK had to reconnect"
    );
    c.close().await;
}
