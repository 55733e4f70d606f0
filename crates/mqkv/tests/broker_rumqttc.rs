//! Broker interop with the `rumqttc` client, MQTT 5 and MQTT 3.1.1, against a running server.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ServerProcess, TIMEOUT};
use rumqttc::v5::mqttbytes::v5::{LastWill, LastWillProperties, Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};

fn v5(id: &str, port: u16) -> (AsyncClient, EventLoop) {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(10));
    AsyncClient::new(o, 100)
}

/// Polls until a PUBLISH arrives (or the timeout passes).
async fn next_publish(el: &mut EventLoop) -> rumqttc::v5::mqttbytes::v5::Publish {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Event::Incoming(Packet::Publish(p)) = el.poll().await.expect("poll") {
                return p;
            }
        }
    })
    .await
    .expect("publish in time")
}

/// Polls until the SUBACK arrives.
async fn until_suback(el: &mut EventLoop) -> Vec<rumqttc::v5::mqttbytes::v5::SubscribeReasonCode> {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Event::Incoming(Packet::SubAck(s)) = el.poll().await.expect("poll") {
                return s.return_codes;
            }
        }
    })
    .await
    .expect("suback in time")
}

/// Polls a 3.1.1 client until a packet matching `want` arrives.
async fn v4_until(el: &mut rumqttc::EventLoop, want: impl Fn(&rumqttc::Packet) -> bool) {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let rumqttc::Event::Incoming(p) = el.poll().await.expect("poll") {
                if want(&p) {
                    break;
                }
            }
        }
    })
    .await
    .expect("packet in time");
}

/// Polls until `n` PUBACKs have arrived.
async fn wait_acks(el: &mut EventLoop, n: usize) {
    tokio::time::timeout(TIMEOUT, async {
        let mut acked = 0;
        while acked < n {
            if let Event::Incoming(Packet::PubAck(_)) = el.poll().await.expect("poll") {
                acked += 1;
            }
        }
    })
    .await
    .expect("acks in time");
}

/// Drives an event loop in the background.
fn drive(mut el: EventLoop) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { while el.poll().await.is_ok() {} })
}

#[tokio::test]
async fn v5_properties_are_forwarded_unchanged_at_every_qos() {
    let mut server = ServerProcess::start(&[]);
    let (sub, mut sub_el) = v5("sub", server.port);
    sub.subscribe("t/#", QoS::ExactlyOnce).await.unwrap();
    until_suback(&mut sub_el).await;
    let (publ, publ_el) = v5("pub", server.port);
    let pump = drive(publ_el);
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let props = PublishProperties {
            payload_format_indicator: Some(1),
            content_type: Some("text/plain".into()),
            response_topic: Some("reply/here".into()),
            correlation_data: Some(Bytes::from_static(b"\x00\x01\x02")),
            user_properties: vec![
                ("b".into(), "2".into()),
                ("a".into(), "1".into()),
                ("b".into(), "3".into()),
            ],
            ..Default::default()
        };
        publ.publish_with_properties("t/x", qos, false, "héllo", props)
            .await
            .unwrap();
        let got = next_publish(&mut sub_el).await;
        assert_eq!(got.qos, qos);
        assert_eq!(&got.topic[..], b"t/x");
        assert_eq!(&got.payload[..], "héllo".as_bytes());
        let p = got.properties.expect("properties");
        assert_eq!(p.payload_format_indicator, Some(1));
        assert_eq!(p.content_type.as_deref(), Some("text/plain"));
        assert_eq!(p.response_topic.as_deref(), Some("reply/here"));
        assert_eq!(p.correlation_data.as_deref(), Some(&b"\x00\x01\x02"[..]));
        assert_eq!(
            p.user_properties,
            vec![
                ("b".to_string(), "2".to_string()),
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "3".to_string())
            ]
        );
    }
    pump.abort();
    server.assert_alive();
}

#[tokio::test]
async fn v311_and_v5_clients_share_topics_and_retained_messages() {
    let mut server = ServerProcess::start(&[]);
    // A 3.1.1 publisher leaves a retained message.
    let mut o = rumqttc::MqttOptions::new("old", "127.0.0.1", server.port);
    o.set_keep_alive(Duration::from_secs(10));
    let (old, mut old_el) = rumqttc::AsyncClient::new(o, 10);
    old.publish("r/1", rumqttc::QoS::AtLeastOnce, true, "kept")
        .await
        .unwrap();
    v4_until(&mut old_el, |p| matches!(p, rumqttc::Packet::PubAck(_))).await;
    // A v5 subscriber gets it with the retain flag set.
    let (sub, mut sub_el) = v5("new", server.port);
    sub.subscribe("r/+", QoS::AtLeastOnce).await.unwrap();
    let got = next_publish(&mut sub_el).await;
    assert!(got.retain);
    assert_eq!(&got.payload[..], b"kept");
    // A v5 publish reaches a 3.1.1 subscriber.
    old.subscribe("live", rumqttc::QoS::AtLeastOnce)
        .await
        .unwrap();
    v4_until(&mut old_el, |p| matches!(p, rumqttc::Packet::SubAck(_))).await;
    let pump = drive(sub_el);
    sub.publish("live", QoS::AtLeastOnce, false, "v5->v4")
        .await
        .unwrap();
    let p = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) =
                old_el.poll().await.unwrap()
            {
                return p;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(p.topic, "live");
    assert_eq!(&p.payload[..], b"v5->v4");
    pump.abort();
    server.assert_alive();
}

#[tokio::test]
async fn persistent_session_receives_what_was_published_while_away() {
    let server = ServerProcess::start(&[]);
    let mut o = MqttOptions::new("durable", "127.0.0.1", server.port);
    o.set_clean_start(true);
    o.set_session_expiry_interval(Some(300));
    let (c, mut el) = AsyncClient::new(o.clone(), 10);
    c.subscribe("q", QoS::AtLeastOnce).await.unwrap();
    until_suback(&mut el).await;
    c.disconnect().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while el.poll().await.is_ok() {}
    })
    .await;
    drop(el);

    let (p, mut pel) = v5("publisher", server.port);
    for i in 0..3 {
        p.publish("q", QoS::AtLeastOnce, false, format!("m{i}"))
            .await
            .unwrap();
    }
    // All three are with the broker once acknowledged.
    wait_acks(&mut pel, 3).await;
    let pump = drive(pel);

    o.set_clean_start(false);
    let (_c2, mut el2) = AsyncClient::new(o, 10);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(String::from_utf8(next_publish(&mut el2).await.payload.to_vec()).unwrap());
    }
    assert_eq!(got, vec!["m0", "m1", "m2"]);
    pump.abort();
}

#[tokio::test]
async fn shared_subscription_splits_messages_between_members() {
    let server = ServerProcess::start(&[]);
    let mut members = Vec::new();
    for id in ["m1", "m2"] {
        let (c, mut el) = v5(id, server.port);
        c.subscribe("$share/g/work", QoS::AtLeastOnce)
            .await
            .unwrap();
        until_suback(&mut el).await;
        members.push((c, el));
    }
    let (p, mut pel) = v5("producer", server.port);
    for i in 0..20 {
        p.publish("work", QoS::AtLeastOnce, false, format!("{i}"))
            .await
            .unwrap();
    }
    // Every message has been routed once the broker acknowledged it.
    wait_acks(&mut pel, 20).await;
    let pump = drive(pel);
    let mut counts = Vec::new();
    let mut all = Vec::new();
    for (_c, el) in members.iter_mut() {
        let mut n = 0;
        while let Ok(Ok(ev)) = tokio::time::timeout(Duration::from_millis(700), el.poll()).await {
            if let Event::Incoming(Packet::Publish(p)) = ev {
                n += 1;
                all.push(String::from_utf8(p.payload.to_vec()).unwrap());
            }
        }
        counts.push(n);
    }
    all.sort_by_key(|s| s.parse::<u32>().unwrap());
    assert_eq!(all, (0..20).map(|i| i.to_string()).collect::<Vec<_>>());
    assert!(
        counts.iter().all(|n| *n > 0),
        "both members served: {counts:?}"
    );
    pump.abort();
}

#[tokio::test]
async fn will_is_published_on_network_loss_but_not_on_normal_disconnect() {
    let server = ServerProcess::start(&[]);
    let (w, mut wel) = v5("watcher", server.port);
    w.subscribe("wills/#", QoS::AtLeastOnce).await.unwrap();
    until_suback(&mut wel).await;

    // Normal DISCONNECT: no will.
    let mut o = MqttOptions::new("polite", "127.0.0.1", server.port);
    o.set_last_will(LastWill::new(
        "wills/polite",
        "gone",
        QoS::AtLeastOnce,
        false,
        None,
    ));
    let (c, mut el) = AsyncClient::new(o, 10);
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Event::Incoming(Packet::ConnAck(_)) = el.poll().await.unwrap() {
                break;
            }
        }
    })
    .await
    .unwrap();
    c.disconnect().await.unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while el.poll().await.is_ok() {}
    })
    .await;

    // Network loss: the will arrives, with its properties.
    let mut o = MqttOptions::new("rude", "127.0.0.1", server.port);
    let props = LastWillProperties {
        delay_interval: None,
        payload_format_indicator: None,
        message_expiry_interval: None,
        content_type: Some("text/plain".into()),
        response_topic: None,
        correlation_data: None,
        user_properties: vec![("why".into(), "lost".into())],
    };
    o.set_last_will(LastWill::new(
        "wills/rude",
        "gone",
        QoS::AtLeastOnce,
        false,
        Some(props),
    ));
    let (_c, mut el) = AsyncClient::new(o, 10);
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Event::Incoming(Packet::ConnAck(_)) = el.poll().await.unwrap() {
                break;
            }
        }
    })
    .await
    .unwrap();
    drop(el); // closes the socket without DISCONNECT

    let got = next_publish(&mut wel).await;
    assert_eq!(&got.topic[..], b"wills/rude", "only the rude client's will");
    let p = got.properties.expect("will properties");
    assert_eq!(p.content_type.as_deref(), Some("text/plain"));
    assert_eq!(
        p.user_properties,
        vec![("why".to_string(), "lost".to_string())]
    );
}
