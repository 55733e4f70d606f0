//! Retained messages and persistent sessions survive a restart of a durable server.

mod common;

use std::time::Duration;

use common::{serve_refused, temp_dir, ServerProcess, TIMEOUT};
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};

async fn connack(el: &mut EventLoop) -> bool {
    tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Event::Incoming(Packet::ConnAck(c)) = el.poll().await.expect("poll") {
                return c.session_present;
            }
        }
    })
    .await
    .expect("connack")
}

async fn settle(el: &mut EventLoop, for_: Duration) -> Vec<String> {
    let mut got = Vec::new();
    while let Ok(Ok(ev)) = tokio::time::timeout(for_, el.poll()).await {
        if let Event::Incoming(Packet::Publish(p)) = ev {
            got.push(String::from_utf8_lossy(&p.payload).into_owned());
        }
    }
    got
}

/// Waits for `n` messages (up to `TIMEOUT`), then for a quiet `300 ms` in which any extra
/// message would be collected too.
async fn collect(el: &mut EventLoop, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(TIMEOUT, async {
        while got.len() < n {
            if let Event::Incoming(Packet::Publish(p)) = el.poll().await.expect("poll") {
                got.push(String::from_utf8_lossy(&p.payload).into_owned());
            }
        }
    })
    .await;
    got.extend(settle(el, Duration::from_millis(300)).await);
    got
}

/// Sets up: retained messages, one of them replaced and one cleared after a save interval,
/// and a persistent session with three messages queued for it.
async fn prepare(port: u16) {
    let mut o = MqttOptions::new("keeper", "127.0.0.1", port);
    o.set_session_expiry_interval(Some(3600));
    let (c, mut el) = AsyncClient::new(o, 10);
    c.subscribe("jobs/#", QoS::AtLeastOnce).await.unwrap();
    connack(&mut el).await;
    settle(&mut el, Duration::from_millis(300)).await;
    c.disconnect().await.unwrap();
    settle(&mut el, Duration::from_millis(300)).await;

    let (p, mut pel) = AsyncClient::new(MqttOptions::new("producer", "127.0.0.1", port), 10);
    for (topic, payload) in [
        ("status/door", "open"),
        ("status/light", "on"),
        ("status/window", "open"),
    ] {
        p.publish(topic, QoS::AtLeastOnce, true, payload)
            .await
            .unwrap();
    }
    settle(&mut pel, Duration::from_millis(1500)).await;
    p.publish("status/light", QoS::AtLeastOnce, true, "off")
        .await
        .unwrap();
    p.publish("status/window", QoS::AtLeastOnce, true, "")
        .await
        .unwrap();
    for i in 0..3 {
        p.publish("jobs/x", QoS::AtLeastOnce, false, format!("job{i}"))
            .await
            .unwrap();
    }
    settle(&mut pel, Duration::from_millis(300)).await;
}

async fn verify(port: u16) {
    let mut o = MqttOptions::new("keeper", "127.0.0.1", port);
    o.set_clean_start(false);
    o.set_session_expiry_interval(Some(3600));
    let (_c, mut el) = AsyncClient::new(o, 10);
    assert!(connack(&mut el).await, "session present after restart");
    let got = collect(&mut el, 3).await;
    assert_eq!(got, vec!["job0", "job1", "job2"]);

    let (s, mut sel) = AsyncClient::new(MqttOptions::new("late", "127.0.0.1", port), 10);
    s.subscribe("status/+", QoS::AtLeastOnce).await.unwrap();
    let got = collect(&mut sel, 2).await;
    assert_eq!(
        got,
        vec!["open", "off"],
        "retained messages survived as last set, the cleared one stayed cleared"
    );
}

#[tokio::test]
async fn graceful_restart_keeps_retained_messages_and_sessions() {
    let dir = temp_dir("graceful");
    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &[]);
    let port = server.port;
    prepare(port).await;
    assert!(server.stop().success(), "clean exit on SIGTERM");
    let server = ServerProcess::start_disk(&dir, &format!("127.0.0.1:{port}"), &[]);
    verify(server.port).await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn crash_after_the_save_interval_keeps_retained_messages_and_sessions() {
    let dir = temp_dir("crash");
    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &["-c", "/dev/null"]);
    let port = server.port;
    prepare(port).await;
    // The documented loss window is one save interval (1 s by default): changes older than
    // that are in a save, given the time to write it (1.5 s of slack here).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.kill9();
    let server = ServerProcess::start_disk(&dir, &format!("127.0.0.1:{port}"), &[]);
    verify(server.port).await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_data_directory_in_use_is_refused() {
    let dir = temp_dir("inuse");
    let _first = ServerProcess::start_disk(&dir, "127.0.0.1:0", &[]);
    let dir = dir.to_str().expect("utf-8 path");
    let err = serve_refused(&[
        "--listen",
        "127.0.0.1:0",
        "--storage",
        "disk",
        "--data-dir",
        dir,
    ]);
    assert!(err.contains("in use"), "clear message: {err}");
    drop(_first);
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `mqkv serve ARGS`, which must refuse to start; returns what it wrote to standard
/// error.

#[tokio::test]
async fn changed_limits_take_effect_after_restart_and_keep_stored_data() {
    use common::store::Client;
    let dir = temp_dir("limits");
    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &["--max-keys", "1"]);
    let mut c = Client::connect("limits", server.port).await;
    assert_eq!(&c.call(&[b"SET", b"a", b"1"]).await.payload[..], b"+OK\r\n");
    let refused = c.call(&[b"SET", b"b", b"2"]).await;
    assert_eq!(
        &refused.payload[..],
        b"-ERR the quota has been exceeded\r\n"
    );
    drop(c);
    assert!(server.stop().success());

    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &["--max-keys", "5"]);
    let mut c = Client::connect("limits", server.port).await;
    assert_eq!(&c.call(&[b"SET", b"b", b"2"]).await.payload[..], b"+OK\r\n");
    drop(c);
    assert!(server.stop().success());

    // Lowered below what is stored: nothing stored is harmed, new keys are refused.
    let server = ServerProcess::start_disk(&dir, "127.0.0.1:0", &["--max-keys", "1"]);
    let mut c = Client::connect("limits", server.port).await;
    assert_eq!(&c.call(&[b"GET", b"a"]).await.payload[..], b"$1\r\n1\r\n");
    assert_eq!(&c.call(&[b"GET", b"b"]).await.payload[..], b"$1\r\n2\r\n");
    let refused = c.call(&[b"SET", b"c", b"3"]).await;
    assert_eq!(
        &refused.payload[..],
        b"-ERR the quota has been exceeded\r\n"
    );
    drop(c);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
