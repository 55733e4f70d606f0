//! The official AIO Rust SDK on secured servers: the state store's operations and key
//! notifications over mutual TLS, and with a user name and password from a password file.

#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use azure_iot_operations_services::state_store::SetOptions;

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
