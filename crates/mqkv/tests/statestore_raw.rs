//! The state store at the byte level, through `rumqttc`: the cases the official SDKs never send.

mod common;

use common::store::{now_ms, resp, ts, Client, REQUEST_TOPIC};

use std::time::Duration;

use bytes::Bytes;
use common::{ServerProcess, TIMEOUT};
use rumqttc::v5::mqttbytes::v5::PublishProperties;
use rumqttc::v5::mqttbytes::QoS;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

fn notify_topic(client: &str, key: &[u8]) -> String {
    format!(
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/{}/command/notify/{}",
        hex(client.as_bytes()),
        hex(key)
    )
}

#[tokio::test]
async fn responses_are_byte_exact_with_status_and_versions() {
    let mut server = ServerProcess::start(&[]);
    let mut c = Client::connect("raw1", server.port).await;

    let set = c.call(&[b"SET", b"k", b"v"]).await;
    assert_eq!(&set.payload[..], b"+OK\r\n");
    assert_eq!(set.user("__stat"), Some("200"));
    assert_eq!(set.user("__protVer"), Some("1.0"));
    assert_eq!(
        set.props.content_type.as_deref(),
        Some("application/octet-stream")
    );
    let v1 = set
        .user("__ts")
        .expect("SET carries the version")
        .to_owned();

    let get = c.call(&[b"GET", b"k"]).await;
    assert_eq!(&get.payload[..], b"$1\r\nv\r\n");
    assert_eq!(get.user("__ts"), Some(v1.as_str()));

    let miss = c.call(&[b"GET", b"nokey"]).await;
    assert_eq!(&miss.payload[..], b"$-1\r\n");
    assert_eq!(miss.user("__ts"), None, "a GET miss carries no __ts");

    let nx = c.call(&[b"SET", b"k", b"other", b"NX"]).await;
    assert_eq!(&nx.payload[..], b":-1\r\n");
    assert_eq!(
        nx.user("__ts"),
        Some(v1.as_str()),
        "not applied carries the stored version"
    );

    let vdel = c.call(&[b"VDEL", b"k", b"wrong"]).await;
    assert_eq!(&vdel.payload[..], b":-1\r\n");
    let del = c.call(&[b"DEL", b"k"]).await;
    assert_eq!(&del.payload[..], b":1\r\n");
    let del = c.call(&[b"DEL", b"k"]).await;
    assert_eq!(&del.payload[..], b":0\r\n");
    let stop = c.call(&[b"KEYNOTIFY", b"k", b"STOP"]).await;
    assert_eq!(&stop.payload[..], b":0\r\n");
    server.assert_alive();
}

#[tokio::test]
async fn versions_increase_and_exceed_the_request_timestamp() {
    let server = ServerProcess::start(&[]);
    let mut c = Client::connect("raw2", server.port).await;
    let parse = |s: &str| {
        let p: Vec<&str> = s.split(':').collect();
        assert_eq!(p.len(), 3, "{s}");
        (
            p[0].parse::<u64>().unwrap(),
            p[1].parse::<u64>().unwrap(),
            p[2].to_owned(),
        )
    };
    // Sequential writes a few milliseconds apart: strictly increasing, counter 0, one node id.
    let mut last: Option<(u64, u64, String)> = None;
    for i in 0..5 {
        let a = c.call(&[b"SET", b"k", format!("{i}").as_bytes()]).await;
        let now = parse(a.user("__ts").unwrap());
        if let Some(prev) = &last {
            assert!(now > *prev, "{now:?} > {prev:?}");
            assert_eq!(now.2, prev.2, "stable node id");
        }
        assert_eq!(now.1, 0, "counter stays 0 for sequential writes");
        last = Some(now);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A request stamped in the future (within the allowed skew) gets a version above it.
    let future = now_ms() + 30_000;
    let a = c
        .call_with(
            resp(&[b"SET", b"k", b"f"]),
            vec![("__ts".into(), ts(future))],
        )
        .await;
    let v = parse(a.user("__ts").unwrap());
    assert!(v.0 > future, "version {v:?} > request {future}");
    let next = parse(c.call(&[b"SET", b"k", b"g"]).await.user("__ts").unwrap());
    assert!(
        next > v,
        "versions keep increasing after the jump: {next:?} > {v:?}"
    );
}

#[tokio::test]
async fn malformed_requests_get_the_documented_errors() {
    let mut server = ServerProcess::start(&[]);
    let mut c = Client::connect("raw3", server.port).await;
    let now = vec![("__ts".to_string(), ts(now_ms()))];
    // (payload, user properties, expected answer)
    type Case = (Vec<u8>, Vec<(String, String)>, &'static [u8]);
    let cases: Vec<Case> = vec![
        (b"garbage".to_vec(), now.clone(), b"-ERR syntax error\r\n"),
        (b"*2\r\n$3\r\nGET\r\n$5\r\nab\r\n".to_vec(), now.clone(), b"-ERR syntax error\r\n"),
        (b"*1\r\n$3\r\nGET\r\n".to_vec(), now.clone(), b"-ERR wrong number of arguments\r\n"),
        (resp(&[b"GET", b"a", b"b"]), now.clone(), b"-ERR wrong number of arguments\r\n"),
        (resp(&[b"FLY", b"a"]), now.clone(), b"-ERR unknown command\r\n"),
        (resp(&[b"GET", b""]), now.clone(), b"-ERR the key length is zero\r\n"),
        (resp(&[b"SET", b"k", b"v", b"PX", b"0"]), now.clone(), b"-ERR syntax error\r\n"),
        (resp(&[b"SET", b"k", b"v", b"PX", b"-5"]), now.clone(), b"-ERR syntax error\r\n"),
        (resp(&[b"SET", b"k", b"v", b"NX", b"NEX"]), now.clone(), b"-ERR syntax error\r\n"),
        (resp(&[b"SET", b"k", b"v"]), vec![], b"-ERR missing timestamp\r\n"),
        (
            resp(&[b"SET", b"k", b"v"]),
            vec![("__ts".into(), "yesterday".into())],
            b"-ERR malformed timestamp\r\n",
        ),
        (
            resp(&[b"SET", b"k", b"v"]),
            vec![("__ts".into(), ts(now_ms())), ("__ft".into(), "1:2".into())],
            b"-ERR malformed timestamp\r\n",
        ),
        (
            resp(&[b"SET", b"k", b"v"]),
            vec![("__ts".into(), ts(now_ms() + 3_600_000))],
            b"-ERR the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n",
        ),
        (
            resp(&[b"SET", b"k", b"v"]),
            vec![("__ts".into(), ts(now_ms())), ("__ft".into(), ts(now_ms() + 3_600_000))],
            b"-ERR the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n",
        ),
    ];
    for (payload, user, want) in cases {
        let a = c.call_with(payload.clone(), user).await;
        assert_eq!(
            String::from_utf8_lossy(&a.payload),
            String::from_utf8_lossy(want),
            "request {:?}",
            String::from_utf8_lossy(&payload)
        );
        assert_eq!(a.user("__stat"), Some("200"));
    }
    // Lower-case verbs and options are accepted; a fractional PX is truncated.
    let a = c.call(&[b"set", b"lk", b"v", b"px", b"1500.7"]).await;
    assert_eq!(&a.payload[..], b"+OK\r\n");
    let a = c.call(&[b"get", b"lk"]).await;
    assert_eq!(&a.payload[..], b"$1\r\nv\r\n");
    server.assert_alive();
}

#[tokio::test]
async fn unsupported_protocol_version_gets_status_505() {
    let server = ServerProcess::start(&[]);
    let mut c = Client::connect("raw4", server.port).await;
    let a = c
        .call_with(
            resp(&[b"GET", b"k"]),
            vec![
                ("__protVer".into(), "2.0".into()),
                ("__ts".into(), ts(now_ms())),
            ],
        )
        .await;
    assert_eq!(a.user("__stat"), Some("505"));
    assert_eq!(a.user("__supProtMajVer"), Some("1"));
    assert_eq!(a.user("__requestProtVer"), Some("2.0"));
    assert_eq!(a.user("__protVer"), Some("1.0"));
    assert!(a.payload.is_empty());
}

#[tokio::test]
async fn notifications_reach_observers_without_a_subscription_and_before_the_response() {
    let server = ServerProcess::start(&[]);
    let mut watcher = Client::connect("watcher", server.port).await;
    let mut writer = Client::connect("writer", server.port).await;
    // The watcher never subscribes to its notification topic.
    let a = watcher.call(&[b"KEYNOTIFY", b"key\x00bin"]).await;
    assert_eq!(&a.payload[..], b"+OK\r\n");
    let a = watcher.call(&[b"KEYNOTIFY", b"key\x00bin"]).await;
    assert_eq!(&a.payload[..], b"+OK\r\n", "repeated KEYNOTIFY is +OK");

    let set = writer.call(&[b"SET", b"key\x00bin", b"val"]).await;
    let version = set.user("__ts").unwrap().to_owned();
    let topic = notify_topic("watcher", b"key\x00bin");
    let n = watcher.wait_for(|p| p.topic == topic.as_bytes()).await;
    assert_eq!(
        &n.payload[..],
        b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nval\r\n"
    );
    let props = n.properties.unwrap();
    assert!(props.user_properties.contains(&("__ts".into(), version)));
    assert!(props.correlation_data.is_none());

    // The observer's own write: its notification comes before its response.
    let c = watcher.correlation();
    watcher
        .send(
            resp(&[b"DEL", b"key\x00bin"]),
            vec![("__ts".into(), ts(now_ms()))],
            c.clone(),
        )
        .await;
    let mut order = Vec::new();
    while order.len() < 2 {
        let p = watcher.wait_for(|_| true).await;
        if p.topic == topic.as_bytes() {
            assert_eq!(&p.payload[..], b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
            order.push("notify");
        } else if p
            .properties
            .as_ref()
            .and_then(|x| x.correlation_data.as_ref())
            == Some(&c)
        {
            order.push("response");
        }
    }
    assert_eq!(order, vec!["notify", "response"]);

    // After STOP, nothing more.
    let a = watcher.call(&[b"KEYNOTIFY", b"key\x00bin", b"STOP"]).await;
    assert_eq!(&a.payload[..], b"+OK\r\n");
    writer.call(&[b"SET", b"key\x00bin", b"again"]).await;
    let extra = watcher.drain(Duration::from_millis(500)).await;
    assert!(
        extra.iter().all(|p| p.topic != topic.as_bytes()),
        "no notification after STOP"
    );
}

#[tokio::test]
async fn expiry_deletes_promptly_and_notifies() {
    let server = ServerProcess::start(&[]);
    let mut c = Client::connect("exp", server.port).await;
    c.call(&[b"KEYNOTIFY", b"lease"]).await;
    let set = c
        .call(&[b"SET", b"lease", b"me", b"NEX", b"PX", b"300"])
        .await;
    assert_eq!(&set.payload[..], b"+OK\r\n");
    let topic = notify_topic("exp", b"lease");
    // The SET notification, then the DELETE from expiry.
    let first = c.wait_for(|p| p.topic == topic.as_bytes()).await;
    assert!(first.payload.starts_with(b"*4\r\n"));
    // Promptly: within `wait_for`'s generous deadline (the expiry loop looks at least once
    // a second).
    let del = c.wait_for(|p| p.topic == topic.as_bytes()).await;
    assert_eq!(&del.payload[..], b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
    let get = c.call(&[b"GET", b"lease"]).await;
    assert_eq!(&get.payload[..], b"$-1\r\n");
}

#[tokio::test]
async fn redelivered_requests_get_the_first_answer_and_apply_once() {
    let server = ServerProcess::start(&[]);
    let mut c = Client::connect("dedup", server.port).await;
    let corr = c.correlation();
    let req = resp(&[b"SET", b"once", b"v", b"NX"]);
    c.send(
        req.clone(),
        vec![("__ts".into(), ts(now_ms()))],
        corr.clone(),
    )
    .await;
    let first = c.wait_response(&corr).await;
    c.send(
        req.clone(),
        vec![("__ts".into(), ts(now_ms()))],
        corr.clone(),
    )
    .await;
    let second = c.wait_response(&corr).await;
    assert_eq!(&first.payload[..], b"+OK\r\n");
    assert_eq!(
        &second.payload[..],
        b"+OK\r\n",
        "the redelivery gets the first answer"
    );
    assert_eq!(first.user("__ts"), second.user("__ts"));
    // A new request (new correlation data) is judged afresh.
    let third = c.call_with(req, vec![("__ts".into(), ts(now_ms()))]).await;
    assert_eq!(&third.payload[..], b":-1\r\n");
}

#[tokio::test]
async fn fencing_tokens_guard_writes() {
    let server = ServerProcess::start(&[]);
    let mut c = Client::connect("fence", server.port).await;
    let lock = c
        .call(&[b"SET", b"lock", b"me", b"NEX", b"PX", b"10000"])
        .await;
    let token = lock.user("__ts").unwrap().to_owned();
    let with = |ft: &str| {
        vec![
            ("__ts".to_string(), ts(now_ms())),
            ("__ft".to_string(), ft.to_string()),
        ]
    };
    let a = c
        .call_with(resp(&[b"SET", b"guarded", b"1"]), with(&token))
        .await;
    assert_eq!(&a.payload[..], b"+OK\r\n");
    let a = c.call(&[b"SET", b"guarded", b"2"]).await;
    assert_eq!(
        &a.payload[..],
        b"-ERR a fencing token is required for this request\r\n"
    );
    let a = c
        .call_with(
            resp(&[b"SET", b"guarded", b"3"]),
            with("000000000000000:00000:old"),
        )
        .await;
    assert_eq!(
        &a.payload[..],
        &b"-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n"[..]
    );
    let a = c
        .call_with(
            resp(&[b"DEL", b"guarded"]),
            vec![("__ts".into(), ts(now_ms()))],
        )
        .await;
    assert_eq!(
        &a.payload[..],
        b"-ERR a fencing token is required for this request\r\n"
    );
    let a = c
        .call_with(resp(&[b"VDEL", b"guarded", b"x"]), with(&token))
        .await;
    assert_eq!(&a.payload[..], b":-1\r\n");
    let a = c.call_with(resp(&[b"DEL", b"guarded"]), with(&token)).await;
    assert_eq!(&a.payload[..], b":1\r\n");
}

#[tokio::test]
async fn quotas_refuse_new_data_and_keep_what_is_stored() {
    let mut server = ServerProcess::start(&["--max-keys", "2"]);
    let mut c = Client::connect("quota", server.port).await;
    assert_eq!(&c.call(&[b"SET", b"a", b"1"]).await.payload[..], b"+OK\r\n");
    assert_eq!(&c.call(&[b"SET", b"b", b"2"]).await.payload[..], b"+OK\r\n");
    let a = c.call(&[b"SET", b"c", b"3"]).await;
    assert_eq!(&a.payload[..], b"-ERR the quota has been exceeded\r\n");
    assert_eq!(
        &c.call(&[b"SET", b"a", b"changed"]).await.payload[..],
        b"+OK\r\n"
    );
    assert_eq!(
        &c.call(&[b"GET", b"a"]).await.payload[..],
        b"$7\r\nchanged\r\n"
    );
    assert_eq!(&c.call(&[b"GET", b"b"]).await.payload[..], b"$1\r\n2\r\n");
    server.assert_alive();
}

#[tokio::test]
async fn large_keys_and_values_and_empty_values() {
    let server = ServerProcess::start(&[]);
    let mut c = Client::connect("big", server.port).await;
    let key = vec![0u8; 6500];
    let value = vec![0xABu8; 1 << 20];
    assert_eq!(
        &c.call(&[b"SET", &key, &value]).await.payload[..],
        b"+OK\r\n"
    );
    let got = c.call(&[b"GET", &key]).await;
    let mut want = format!("${}\r\n", value.len()).into_bytes();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\n");
    assert!(got.payload[..] == want[..], "1 MiB value round-trips");
    assert_eq!(&c.call(&[b"SET", b"e", b""]).await.payload[..], b"+OK\r\n");
    assert_eq!(&c.call(&[b"GET", b"e"]).await.payload[..], b"$0\r\n\r\n");
}

#[tokio::test]
async fn unanswerable_and_reserved_topic_requests() {
    let mut server = ServerProcess::start(&[]);
    let mut c = Client::connect("rude", server.port).await;
    // No correlation data: dropped, no answer.
    let requester = c.client.clone();
    let get = |props: PublishProperties| {
        let client = requester.clone();
        async move {
            client
                .publish_with_properties(
                    REQUEST_TOPIC,
                    QoS::AtLeastOnce,
                    false,
                    resp(&[b"GET", b"k"]),
                    props,
                )
                .await
                .unwrap();
        }
    };
    get(PublishProperties {
        response_topic: Some("clients/rude/response".into()),
        ..Default::default()
    })
    .await;
    let got = c.drain(Duration::from_millis(500)).await;
    assert!(got.is_empty(), "no answer without correlation data");
    // The server is still serving.
    assert_eq!(&c.call(&[b"GET", b"k"]).await.payload[..], b"$-1\r\n");
    // A response topic inside the notification namespace: the client is disconnected.
    get(PublishProperties {
        response_topic: Some(
            "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x/command/notify/41".into(),
        ),
        correlation_data: Some(Bytes::from_static(b"0123456789abcdef")),
        ..Default::default()
    })
    .await;
    let reason = tokio::time::timeout(TIMEOUT, async {
        loop {
            match c.el.poll().await {
                Ok(_) => {}
                Err(rumqttc::v5::ConnectionError::MqttState(
                    rumqttc::v5::StateError::ServerDisconnect { reason_code, .. },
                )) => return Some(reason_code),
                Err(_) => return None,
            }
        }
    })
    .await
    .expect("disconnected in time");
    assert_eq!(
        reason,
        Some(rumqttc::v5::mqttbytes::v5::DisconnectReasonCode::NotAuthorized),
        "DISCONNECT 0x87"
    );
    server.assert_alive();
}

#[tokio::test]
async fn observations_end_with_the_connection_even_when_the_session_stays() {
    let server = ServerProcess::start(&[]);
    let persistent = |o: &mut rumqttc::v5::MqttOptions| {
        o.set_session_expiry_interval(Some(300));
    };
    let mut watcher = Client::connect_with("leaver", server.port, persistent).await;
    assert_eq!(
        &watcher.call(&[b"KEYNOTIFY", b"k"]).await.payload[..],
        b"+OK\r\n"
    );
    watcher.client.disconnect().await.unwrap();
    let _ = watcher.drain(Duration::from_millis(300)).await;
    drop(watcher);

    let mut writer = Client::connect("changer", server.port).await;
    assert_eq!(
        &writer.call(&[b"SET", b"k", b"v"]).await.payload[..],
        b"+OK\r\n"
    );

    // The session (with its response subscription) is still there, but the observation ended
    // with the connection that made it: no notification was queued for it.
    let mut back = Client::connect_with("leaver", server.port, |o| {
        o.set_session_expiry_interval(Some(300));
        o.set_clean_start(false);
    })
    .await;
    let topic = format!(
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/{}/command/notify/6B",
        "6C6561766572"
    );
    let got = back.drain(Duration::from_millis(700)).await;
    assert!(
        got.iter().all(|p| p.topic != topic.as_bytes()),
        "no notification for an observation of a closed connection"
    );
    // A new observation on the new connection works.
    assert_eq!(
        &back.call(&[b"KEYNOTIFY", b"k"]).await.payload[..],
        b"+OK\r\n"
    );
    writer.call(&[b"DEL", b"k"]).await;
    let n = back.wait_for(|p| p.topic == topic.as_bytes()).await;
    assert_eq!(&n.payload[..], b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n");
}

/// A key whose notification topic would not fit MQTT's 65,535-byte topic limit cannot be
/// observed: KEYNOTIFY is refused before anything is registered, changes to the key reach no
/// one, and the connection goes on. The longest key that fits is observed and notified with a
/// well-formed PUBLISH.
#[tokio::test]
async fn keys_too_long_for_a_notification_topic_cannot_be_observed() {
    let server = ServerProcess::start(&[]);
    let mut watcher = Client::connect("watcher", server.port).await;
    let mut writer = Client::connect("writer", server.port).await;
    let longest = (65_535 - notify_topic("watcher", b"").len()) / 2;
    let fits = vec![b'f'; longest];
    let too_long = vec![b'x'; longest + 1];
    for key in [too_long.clone(), vec![b'y'; 65_535]] {
        let a = watcher.call(&[b"KEYNOTIFY", &key]).await;
        assert_eq!(
            &a.payload[..],
            b"-ERR the key is too long to be observed\r\n",
            "KEYNOTIFY of {} bytes",
            key.len()
        );
    }
    let a = watcher.call(&[b"KEYNOTIFY", &fits]).await;
    assert_eq!(&a.payload[..], b"+OK\r\n");

    for key in [&too_long, &fits] {
        let a = writer.call(&[b"SET", key, b"v"]).await;
        assert_eq!(&a.payload[..], b"+OK\r\n");
    }
    let topic = notify_topic("watcher", &fits);
    assert!(topic.len() >= 65_534 && topic.len() <= 65_535);
    let n = watcher.wait_for(|p| p.topic.len() > 1000).await;
    assert_eq!(
        n.topic,
        topic.as_bytes(),
        "the one notification is the key that fits"
    );
    // The watcher's connection still answers, and nothing else came.
    let a = watcher.call(&[b"GET", &too_long]).await;
    assert_eq!(&a.payload[..], b"$1\r\nv\r\n");
    let extra = watcher.drain(Duration::from_millis(300)).await;
    assert!(
        extra.iter().all(|p| p.topic.len() < 1000),
        "a second notification"
    );
}

/// A connection may observe at most `--max-observed-keys` keys at once: one more is refused
/// with the store's quota error and registers nothing; KEYNOTIFY again on a key it observes,
/// or on a new key once another is stopped, is accepted.
#[tokio::test]
async fn observations_beyond_the_limit_are_refused() {
    let server = ServerProcess::start(&["--max-observed-keys", "2"]);
    let mut watcher = Client::connect("limited-watcher", server.port).await;
    for key in [&b"w1"[..], b"w2", b"w1"] {
        let a = watcher.call(&[b"KEYNOTIFY", key]).await;
        assert_eq!(&a.payload[..], b"+OK\r\n");
    }
    let a = watcher.call(&[b"KEYNOTIFY", b"w3"]).await;
    assert_eq!(&a.payload[..], b"-ERR the quota has been exceeded\r\n");
    let a = watcher.call(&[b"KEYNOTIFY", b"w1", b"STOP"]).await;
    assert_eq!(&a.payload[..], b"+OK\r\n");
    let a = watcher.call(&[b"KEYNOTIFY", b"w3"]).await;
    assert_eq!(&a.payload[..], b"+OK\r\n");
    // w3 is observed now, w1 no longer.
    let mut writer = Client::connect("limited-writer", server.port).await;
    writer.call(&[b"SET", b"w1", b"x"]).await;
    writer.call(&[b"SET", b"w3", b"y"]).await;
    let n = watcher
        .wait_for(|p| p.topic.ends_with(hex(b"w3").as_bytes()))
        .await;
    assert!(n.payload.ends_with(b"$1\r\ny\r\n"));
    let extra = watcher.drain(Duration::from_millis(300)).await;
    assert!(extra
        .iter()
        .all(|p| !p.topic.ends_with(hex(b"w1").as_bytes())));
}
