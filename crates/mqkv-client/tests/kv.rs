//! GET, SET, DEL, VDEL and SCAN against a real server.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Server, WAIT};
use mqkv_client::{
    Client, ClientOptions, ConnectionStatus, DelOptions, DelOutcome, Error, ErrorKind, SetOptions,
    SetOutcome, VDelOutcome,
};

#[tokio::test]
async fn set_then_get_returns_the_value_and_its_version() {
    let server = Server::start();
    let client = server.client("kv-roundtrip").await;

    assert_eq!(client.get("k").await.unwrap(), None);
    let SetOutcome::Applied { version: v1 } = client.set("k", "one").await.unwrap() else {
        panic!("unconditional SET must apply");
    };
    let got = client.get("k").await.unwrap().expect("just set");
    assert_eq!(got.value, Bytes::from_static(b"one"));
    assert_eq!(got.version, v1, "GET returns the version of the SET");

    let SetOutcome::Applied { version: v2 } = client.set("k", "two").await.unwrap() else {
        panic!("unconditional SET must apply");
    };
    assert!(v2 > v1, "versions increase: {v1} then {v2}");
    // The request's own clock moves past what the server returned.
    assert!(client.timestamp() > v2);
}

#[tokio::test]
async fn binary_empty_and_large_values_round_trip() {
    let server = Server::start();
    let client = server.client("kv-binary").await;

    let binary = Bytes::from_static(b"\x00\xff\r\n*3\r\n$-1\r\n");
    client.set("bin", binary.clone()).await.unwrap();
    assert_eq!(client.get("bin").await.unwrap().unwrap().value, binary);

    client.set("empty", Bytes::new()).await.unwrap();
    assert_eq!(
        client.get("empty").await.unwrap().unwrap().value,
        Bytes::new()
    );

    // Far beyond the MQTT library's default 10 KiB incoming limit.
    let large = Bytes::from(vec![b'x'; 300_000]);
    client.set("large", large.clone()).await.unwrap();
    assert_eq!(client.get("large").await.unwrap().unwrap().value, large);

    let key = Bytes::from_static(b"key\x00with\xffbytes");
    client.set(key.clone(), "v").await.unwrap();
    assert!(client.get(key).await.unwrap().is_some());
}

#[tokio::test]
async fn nx_nex_and_px_conditions() {
    let server = Server::start();
    let client = server.client("kv-conditions").await;

    let nx = SetOptions::new().nx();
    let first = client.set_with("c", "a", &nx).await.unwrap();
    assert!(first.is_applied());
    let again = client.set_with("c", "b", &nx).await.unwrap();
    assert_eq!(
        again,
        SetOutcome::NotApplied {
            current_version: first.version().cloned()
        },
        "a failed NX reports the stored version"
    );

    let nex = SetOptions::new().nex();
    assert!(client.set_with("c", "a", &nex).await.unwrap().is_applied());
    assert!(!client
        .set_with("c", "zzz", &nex)
        .await
        .unwrap()
        .is_applied());
    assert!(client
        .set_with("fresh", "x", &nex)
        .await
        .unwrap()
        .is_applied());
    assert_eq!(client.get("c").await.unwrap().unwrap().value, "a");

    let px = SetOptions::new().expires_in(Duration::from_millis(1_500));
    client.set_with("short", "lived", &px).await.unwrap();
    assert!(client.get("short").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        client.get("short").await.unwrap(),
        None,
        "PX expired the key"
    );

    let zero = SetOptions::new().expires_in(Duration::from_micros(10));
    assert!(matches!(
        client.set_with("z", "v", &zero).await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn del_and_vdel_outcomes() {
    let server = Server::start();
    let client = server.client("kv-delete").await;

    assert_eq!(client.del("nothing").await.unwrap(), DelOutcome::NotFound);
    let set = client.set("d", "v").await.unwrap();
    let DelOutcome::Deleted {
        version: Some(deleted),
    } = client.del("d").await.unwrap()
    else {
        panic!("DEL of a live key deletes it, with a version");
    };
    assert!(Some(&deleted) > set.version());
    assert_eq!(client.get("d").await.unwrap(), None);

    assert_eq!(client.vdel("d", "v").await.unwrap(), VDelOutcome::NotFound);
    client.set("d", "v").await.unwrap();
    assert!(matches!(
        client.vdel("d", "other").await.unwrap(),
        VDelOutcome::ValueMismatch { .. }
    ));
    assert!(client.get("d").await.unwrap().is_some());
    assert!(matches!(
        client.vdel("d", "v").await.unwrap(),
        VDelOutcome::Deleted { .. }
    ));
    assert_eq!(client.get("d").await.unwrap(), None);
}

#[tokio::test]
async fn fencing_tokens_protect_keys_and_errors_carry_the_kind() {
    let server = Server::start();
    let client = server.client("kv-fencing").await;

    let old_token = client.timestamp();
    let token = client.timestamp();
    let fenced = SetOptions::new().fencing_token(token.clone());
    assert!(client
        .set_with("p", "1", &fenced)
        .await
        .unwrap()
        .is_applied());

    let missing = client.set("p", "2").await.unwrap_err();
    assert_eq!(missing.server_kind(), Some(ErrorKind::MissingFencingToken));
    assert_eq!(
        missing.to_string(),
        "the state store refused the request: a fencing token is required for this request"
    );
    let lower = client
        .set_with(
            "p",
            "2",
            &SetOptions::new().fencing_token(old_token.clone()),
        )
        .await
        .unwrap_err();
    assert_eq!(
        lower.server_kind(),
        Some(ErrorKind::FencingTokenLowerVersion)
    );
    let del_missing = client.del("p").await.unwrap_err();
    assert_eq!(
        del_missing.server_kind(),
        Some(ErrorKind::MissingFencingToken)
    );
    let vdel_lower = client
        .vdel_with("p", "1", &DelOptions::new().fencing_token(old_token))
        .await
        .unwrap_err();
    assert_eq!(
        vdel_lower.server_kind(),
        Some(ErrorKind::FencingTokenLowerVersion)
    );

    assert!(client
        .set_with("p", "3", &fenced)
        .await
        .unwrap()
        .is_applied());
    assert!(matches!(
        client
            .del_with("p", &DelOptions::new().fencing_token(token))
            .await
            .unwrap(),
        DelOutcome::Deleted { .. }
    ));
}

#[tokio::test]
async fn scan_pages_through_matching_keys() {
    let server = Server::start();
    let client = server.client("kv-scan").await;

    for i in 0..150 {
        client.set(format!("scan/{i:03}"), "v").await.unwrap();
    }
    for i in 0..20 {
        client.set(format!("other/{i}"), "v").await.unwrap();
    }
    let mut pager = client.scan("scan/*");
    let mut keys = Vec::new();
    let mut pages = 0;
    while let Some(page) = pager.next_page().await.unwrap() {
        pages += 1;
        keys.extend(page);
        assert!(pages < 200, "the pager must end");
    }
    // Once finished, the pager stays finished without asking again.
    assert_eq!(pager.next_page().await.unwrap(), None);
    keys.sort();
    let expected: Vec<Bytes> = (0..150)
        .map(|i| Bytes::from(format!("scan/{i:03}")))
        .collect();
    assert_eq!(keys, expected);

    let mut all = client.scan("*").collect().await.unwrap();
    all.sort();
    assert_eq!(all.len(), 170);
    assert!(client.scan("nomatch*").collect().await.unwrap().is_empty());
    assert!(matches!(
        client.scan("").collect().await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn empty_keys_are_refused_before_sending() {
    let server = Server::start();
    let client = server.client("kv-empty").await;
    assert!(matches!(
        client.get("").await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        client.set("", "v").await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        client.del("").await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        client.observe("").await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test]
async fn connecting_to_a_closed_port_fails_with_the_address() {
    // Take a free port and release it, so nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = Client::connect(ClientOptions::new("127.0.0.1", port))
        .await
        .unwrap_err();
    match err {
        Error::Connect { address, .. } => assert_eq!(address, format!("127.0.0.1:{port}")),
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[tokio::test]
async fn requests_time_out_while_the_server_is_down() {
    let mut server = Server::start();
    let client = server.client("kv-timeout").await;
    client.set("k", "v").await.unwrap();
    server.kill();

    let mut status = client.status();
    tokio::time::timeout(WAIT, async {
        while status.current() != ConnectionStatus::Reconnecting {
            status.changed().await;
        }
    })
    .await
    .expect("the client notices the lost connection");

    let quick = client.with_timeout(Duration::from_millis(700));
    let err = tokio::time::timeout(Duration::from_secs(60), quick.get("k"))
        .await
        .expect("a request with a 700 ms timeout gives up on its own")
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err:?}");
}

#[tokio::test]
async fn requests_made_while_disconnected_complete_after_reconnecting() {
    let mut server = Server::start();
    let options = server
        .options("kv-resend")
        .reconnect_delay(Duration::from_millis(50), Duration::from_millis(200));
    let client = Client::connect(options).await.unwrap();
    client.set("before", "v").await.unwrap();
    server.kill();
    let pending = tokio::spawn({
        let client = client.with_timeout(WAIT);
        async move { client.set("after", "restart").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart();
    let outcome = pending
        .await
        .unwrap()
        .expect("sent once the server is back");
    assert!(outcome.is_applied());
    assert_eq!(client.get("after").await.unwrap().unwrap().value, "restart");
    assert!(matches!(
        client.status().current(),
        ConnectionStatus::Connected { connections: 2 }
    ));
}

#[tokio::test]
async fn disconnect_closes_every_clone() {
    let server = Server::start();
    let client = server.client("kv-close").await;
    let clone = client.clone();
    client.disconnect().await;
    assert_eq!(clone.status().current(), ConnectionStatus::Closed);
    assert!(matches!(clone.get("k").await, Err(Error::Closed)));
}

/// The extensions: compare-and-set on SET and DEL, and MGET.
#[tokio::test]
async fn compare_and_set_and_mget() {
    let server = Server::start();
    let client = server.client("kv-cas").await;
    let SetOutcome::Applied { version: v1 } = client.set("k", "one").await.unwrap() else {
        panic!("unconditional SET must apply");
    };
    let cas = |v: &mqkv_client::Hlc| SetOptions::new().if_version(v.clone());
    let SetOutcome::Applied { version: v2 } = client.set_with("k", "two", &cas(&v1)).await.unwrap()
    else {
        panic!("SET at the current version must apply");
    };
    assert_eq!(
        client.set_with("k", "three", &cas(&v1)).await.unwrap(),
        SetOutcome::NotApplied {
            current_version: Some(v2.clone())
        }
    );
    assert_eq!(
        client.set_with("absent", "x", &cas(&v1)).await.unwrap(),
        SetOutcome::NotApplied {
            current_version: None
        }
    );
    let values = client.mget(["k", "absent"]).await.unwrap();
    assert_eq!(values.len(), 2);
    let first = values[0].as_ref().expect("k exists");
    assert_eq!((&first.value[..], &first.version), (&b"two"[..], &v2));
    assert!(values[1].is_none());
    assert!(matches!(
        client.mget(Vec::<Bytes>::new()).await,
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        client
            .del_with("k", &DelOptions::new().if_version(v1))
            .await
            .unwrap(),
        DelOutcome::NotApplied {
            current_version: Some(v2.clone())
        }
    );
    assert!(matches!(
        client
            .del_with("k", &DelOptions::new().if_version(v2))
            .await
            .unwrap(),
        DelOutcome::Deleted { .. }
    ));
}

/// A pattern watch (an mqkv extension): changes of matching keys only, including new keys.
#[tokio::test]
async fn a_pattern_watch_sees_every_matching_key() {
    let server = Server::start();
    let watcher = server.client("kv-pattern-watcher").await;
    let writer = server.client("kv-pattern-writer").await;
    let mut sensors = watcher.observe_pattern("sensors/*").await.unwrap();
    writer.set("elsewhere", "x").await.unwrap();
    writer.set("sensors/a", "1").await.unwrap();
    writer.del("sensors/a").await.unwrap();
    let first = sensors.recv_timeout(WAIT).await.unwrap().expect("a change");
    assert_eq!(&first.key[..], b"sensors/a");
    assert_eq!(
        first.operation,
        mqkv_client::Operation::Set {
            value: Bytes::from_static(b"1")
        }
    );
    let second = sensors.recv_timeout(WAIT).await.unwrap().expect("a change");
    assert_eq!(second.operation, mqkv_client::Operation::Delete);
    sensors.unobserve().await.unwrap();
}

/// Sixteen writers increment one counter with compare-and-set, retrying when another got
/// there first: no increment is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_and_set_loses_no_update() {
    const WRITERS: usize = 16;
    const EACH: usize = 25;
    let server = Server::start();
    let setup = server.client("cas-counter-setup").await;
    setup.set("counter", "0").await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = server.client(&format!("cas-counter-{w}")).await;
        tasks.push(tokio::spawn(async move {
            let mut retries = 0;
            for _ in 0..EACH {
                loop {
                    let now = client.get("counter").await.unwrap().expect("exists");
                    let n: usize = std::str::from_utf8(&now.value).unwrap().parse().unwrap();
                    let options = SetOptions::new().if_version(now.version);
                    match client
                        .set_with("counter", (n + 1).to_string(), &options)
                        .await
                        .unwrap()
                    {
                        SetOutcome::Applied { .. } => break,
                        SetOutcome::NotApplied { .. } => retries += 1,
                    }
                }
            }
            retries
        }));
    }
    let mut retries = 0;
    for t in tasks {
        retries += t.await.unwrap();
    }
    let end = setup.get("counter").await.unwrap().expect("exists");
    assert_eq!(
        std::str::from_utf8(&end.value).unwrap(),
        (WRITERS * EACH).to_string(),
        "after {retries} retries"
    );
}
