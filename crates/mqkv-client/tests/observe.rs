//! Key observations against a real server, including across a server restart.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{Server, WAIT};
use mqkv_client::{Client, KeyNotification, Observation, Operation, SetOptions};

async fn next(observation: &mut Observation) -> KeyNotification {
    observation
        .recv_timeout(WAIT)
        .await
        .expect("client open")
        .expect("a notification in time")
}

async fn nothing_within(observation: &mut Observation, wait: Duration) {
    let got = observation.recv_timeout(wait).await.expect("client open");
    assert!(got.is_none(), "unexpected notification {got:?}");
}

fn set_of(value: &str) -> Operation {
    Operation::Set {
        value: Bytes::copy_from_slice(value.as_bytes()),
    }
}

#[tokio::test]
async fn sets_deletes_and_expiry_are_notified_with_versions() {
    let server = Server::start();
    let observer = server.client("obs-basic").await;
    let writer = server.client("obs-basic-writer").await;

    let mut obs = observer.observe("door").await.unwrap();
    assert_eq!(obs.initial(), None);

    let set = writer.set("door", "open").await.unwrap();
    let n = next(&mut obs).await;
    assert_eq!(n.key, Bytes::from_static(b"door"));
    assert_eq!(n.operation, set_of("open"));
    assert_eq!(
        Some(&n.version),
        set.version(),
        "SET notification carries the new version"
    );
    assert!(!n.synthesized);

    writer.del("door").await.unwrap();
    let n = next(&mut obs).await;
    assert_eq!(n.operation, Operation::Delete);
    assert!(Some(&n.version) > set.version());

    let px = SetOptions::new().expires_in(Duration::from_millis(200));
    writer.set_with("door", "ajar", &px).await.unwrap();
    assert_eq!(next(&mut obs).await.operation, set_of("ajar"));
    assert_eq!(
        next(&mut obs).await.operation,
        Operation::Delete,
        "expiry is a DELETE"
    );

    // The observer's own writes are notified too.
    observer.set("door", "shut").await.unwrap();
    assert_eq!(next(&mut obs).await.operation, set_of("shut"));
}

#[tokio::test]
async fn initial_state_and_several_observers_of_one_key() {
    let server = Server::start();
    let client = server.client("obs-many").await;
    let set = client.set("k", "v0").await.unwrap();

    let mut a = client.observe("k").await.unwrap();
    let mut b = client.observe("k").await.unwrap();
    let initial = a.initial().expect("key exists");
    assert_eq!(initial.value, "v0");
    assert_eq!(Some(&initial.version), set.version());

    client.set("k", "v1").await.unwrap();
    assert_eq!(next(&mut a).await.operation, set_of("v1"));
    assert_eq!(next(&mut b).await.operation, set_of("v1"));

    // Ending one observation leaves the other working.
    a.unobserve().await.unwrap();
    client.set("k", "v2").await.unwrap();
    assert_eq!(next(&mut b).await.operation, set_of("v2"));

    // Ending the last one withdraws the registration; the client goes on
    // observing other keys.
    client.unobserve(b).await.unwrap();
    let mut other = client.observe("other").await.unwrap();
    client.set("k", "v3").await.unwrap();
    client.set("other", "x").await.unwrap();
    assert_eq!(next(&mut other).await.operation, set_of("x"));
}

#[tokio::test]
async fn observing_again_after_unobserve_reports_each_change_once() {
    let server = Server::start();
    let client = server.client("obs-stop").await;
    let obs = client.observe("gone").await.unwrap();
    obs.unobserve().await.unwrap();
    // Observe again: only changes after this point may arrive, exactly once.
    let mut obs = client.observe("gone").await.unwrap();
    client.set("gone", "1").await.unwrap();
    assert_eq!(next(&mut obs).await.operation, set_of("1"));
    nothing_within(&mut obs, Duration::from_millis(500)).await;
}

/// Tries `open` until it succeeds within [`WAIT`]; panics with its last error otherwise.
async fn eventually<T, F, Fut>(what: &str, mut open: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, mqkv_client::Error>>,
{
    let start = std::time::Instant::now();
    loop {
        match open().await {
            Ok(v) => return v,
            Err(e) if start.elapsed() > WAIT => panic!("{what}: still refused: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Whether `result` is the server's quota refusal.
fn over_quota<T>(result: Result<T, mqkv_client::Error>) -> bool {
    matches!(
        result,
        Err(mqkv_client::Error::Server(mqkv_client::ServerError::Known(
            mqkv_client::ErrorKind::QuotaExceeded
        )))
    )
}

/// Dropping the last observation of a key or pattern withdraws the server registration in the
/// background, unless the key is observed again first; ending it with `unobserve` withdraws it
/// at once. The server allows one registration of each kind here, so a second is refused until
/// the first is withdrawn.
#[tokio::test]
async fn ending_or_dropping_a_watch_withdraws_its_registration() {
    let server = Server::start_flags(&["--max-observed-keys", "1", "--max-observed-patterns", "1"]);
    let client = server.client("obs-drop").await;

    // Dropped and observed again at once: the registration stays and serves the new one.
    let a = client.observe("a").await.unwrap();
    drop(a);
    let mut a = client.observe("a").await.expect("observe a again");
    client.set("a", "0").await.unwrap();
    assert_eq!(next(&mut a).await.operation, set_of("0"));
    assert!(over_quota(client.observe("b").await), "one key at a time");

    drop(a);
    let b = eventually("observe b after dropping a", || client.observe("b")).await;
    b.unobserve().await.unwrap();
    let mut c = client.observe("c").await.expect("observe c after ending b");

    let sensors = client.observe_pattern("sensors/*").await.unwrap();
    assert!(
        over_quota(client.observe_pattern("doors/*").await),
        "one pattern at a time"
    );
    drop(sensors);
    let doors = eventually("watch doors/* after dropping sensors/*", || {
        client.observe_pattern("doors/*")
    })
    .await;
    doors.unobserve().await.unwrap();
    let mut lights = client
        .observe_pattern("lights/*")
        .await
        .expect("watch lights/* after ending doors/*");

    // What is still open works.
    client.set("c", "1").await.unwrap();
    client.set("lights/hall", "on").await.unwrap();
    assert_eq!(next(&mut c).await.operation, set_of("1"));
    let change = lights
        .recv_timeout(WAIT)
        .await
        .expect("client open")
        .expect("a notification in time");
    assert_eq!(change.key, Bytes::from_static(b"lights/hall"));
}

/// The observer is away (server killed and restarted on the same port)
/// while another client changes the key: the observer reports the change
/// as a synthesized SET when it comes back.
#[tokio::test]
async fn a_set_made_while_the_observer_was_away_is_reported() {
    let mut server = Server::start();
    let options = server
        .options("obs-away-set")
        // Come back slowly, so the change below is surely made while away.
        .reconnect_delay(Duration::from_secs(6), Duration::from_secs(6));
    let observer = Client::connect(options).await.unwrap();
    let writer = server.client("obs-away-set-writer").await;

    writer.set("sensor", "20").await.unwrap();
    let mut obs = observer.observe("sensor").await.unwrap();
    assert_eq!(
        obs.initial().map(|v| v.value.clone()),
        Some(Bytes::from_static(b"20"))
    );
    writer.set("sensor", "21").await.unwrap();
    assert_eq!(next(&mut obs).await.operation, set_of("21"));

    server.restart();
    // The new server starts empty; write the key before the observer is back.
    let writer = Client::connect(server.options("obs-away-set-writer-2"))
        .await
        .unwrap();
    let while_away = writer.set("sensor", "22").await.unwrap();

    let n = next(&mut obs).await;
    assert!(n.synthesized, "{n:?}");
    assert_eq!(n.operation, set_of("22"));
    assert_eq!(Some(&n.version), while_away.version());

    // Observation is live again on the new server.
    writer.set("sensor", "23").await.unwrap();
    let n = next(&mut obs).await;
    assert_eq!(n.operation, set_of("23"));
    assert!(!n.synthesized);
    nothing_within(&mut obs, Duration::from_millis(300)).await;
}

/// The key vanished while the observer was away: a synthesized DELETE.
#[tokio::test]
async fn a_delete_made_while_the_observer_was_away_is_reported() {
    let mut server = Server::start();
    let options = server
        .options("obs-away-del")
        .reconnect_delay(Duration::from_millis(100), Duration::from_millis(500));
    let observer = Client::connect(options).await.unwrap();
    observer.set("lamp", "on").await.unwrap();
    let mut obs = observer.observe("lamp").await.unwrap();
    let last_seen = obs.initial().expect("exists").version.clone();

    // The restarted server keeps nothing in memory: the key is gone.
    server.restart();

    let n = next(&mut obs).await;
    assert!(n.synthesized, "{n:?}");
    assert_eq!(n.operation, Operation::Delete);
    assert!(n.version > last_seen);

    // And notifications flow again after the reconnection.
    observer.set("lamp", "off").await.unwrap();
    let n = next(&mut obs).await;
    assert_eq!(n.operation, set_of("off"));
    assert!(!n.synthesized);
}

/// Nothing changed while away: nothing is reported.
#[tokio::test]
async fn an_unchanged_key_reports_nothing_after_a_reconnect() {
    let mut server = Server::start();
    let options = server
        .options("obs-away-same")
        .reconnect_delay(Duration::from_millis(100), Duration::from_millis(500));
    let observer = Client::connect(options).await.unwrap();
    let mut obs = observer.observe("absent").await.unwrap();
    server.restart();
    let mut status = observer.status();
    tokio::time::timeout(WAIT, async {
        while !matches!(
            status.current(),
            mqkv_client::ConnectionStatus::Connected { connections: 2 }
        ) {
            status.changed().await;
        }
    })
    .await
    .expect("reconnected");
    nothing_within(&mut obs, Duration::from_millis(800)).await;
    observer.set("absent", "now").await.unwrap();
    assert_eq!(next(&mut obs).await.operation, set_of("now"));
}

/// After a restart of a durable server the observation resumes from the last version it saw
/// (`KEYNOTIFY key SINCE version`): every change made while it was away arrives as it
/// happened, in order, none of them synthesized.
#[tokio::test]
async fn changes_made_while_away_arrive_as_they_happened() {
    let dir = std::env::temp_dir().join(format!("mqkv-client-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut server = Server::start_durable(&dir);
    // Slow to reconnect, so that the writer below changes the key while it is away.
    let options = server
        .options("obs-resume")
        .reconnect_delay(Duration::from_secs(2), Duration::from_secs(3));
    let observer = Client::connect(options).await.unwrap();
    observer.set("lamp", "on").await.unwrap();
    let mut obs = observer.observe("lamp").await.unwrap();

    server.restart();
    let writer = server.client("obs-resume-writer").await;
    writer.set("lamp", "dim").await.unwrap();
    writer.set("lamp", "off").await.unwrap();
    writer.del("lamp").await.unwrap();

    let seen = [
        next(&mut obs).await,
        next(&mut obs).await,
        next(&mut obs).await,
    ];
    let operations: Vec<&Operation> = seen.iter().map(|n| &n.operation).collect();
    assert_eq!(
        operations,
        [&set_of("dim"), &set_of("off"), &Operation::Delete],
        "{seen:?}"
    );
    assert!(seen.iter().all(|n| !n.synthesized), "{seen:?}");
    assert!(seen[0].version < seen[1].version && seen[1].version < seen[2].version);
    nothing_within(&mut obs, Duration::from_millis(300)).await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `observe_pattern_since`: the changes after a version of every matching key, then live.
#[tokio::test]
async fn a_pattern_watch_can_start_from_a_version() {
    let server = Server::start();
    let client = server.client("obs-pattern-since").await;
    let first = client.set("room/1", "a").await.unwrap();
    let since = first.version().expect("applied").clone();
    client.set("room/2", "b").await.unwrap();
    client.set("hall", "x").await.unwrap();
    client.del("room/1").await.unwrap();
    let mut rooms = client.observe_pattern_since("room/*", since).await.unwrap();
    let a = rooms.recv_timeout(WAIT).await.unwrap().expect("replayed");
    assert_eq!((&a.key[..], &a.operation), (&b"room/2"[..], &set_of("b")));
    let b = rooms.recv_timeout(WAIT).await.unwrap().expect("replayed");
    assert_eq!(
        (&b.key[..], &b.operation),
        (&b"room/1"[..], &Operation::Delete)
    );
    client.set("room/3", "c").await.unwrap();
    let c = rooms.recv_timeout(WAIT).await.unwrap().expect("live");
    assert_eq!(&c.key[..], b"room/3");
    assert!(rooms
        .recv_timeout(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
}

/// `observe_since`: the changes after a version, then the live ones.
#[tokio::test]
async fn an_observation_can_start_from_a_version() {
    let server = Server::start();
    let client = server.client("obs-since").await;
    let first = client.set("gate", "a").await.unwrap();
    let since = first.version().expect("applied").clone();
    client.set("gate", "b").await.unwrap();
    client.set("gate", "c").await.unwrap();
    let mut obs = client.observe_since("gate", since).await.unwrap();
    assert_eq!(next(&mut obs).await.operation, set_of("b"));
    assert_eq!(next(&mut obs).await.operation, set_of("c"));
    client.set("gate", "d").await.unwrap();
    assert_eq!(next(&mut obs).await.operation, set_of("d"));
    nothing_within(&mut obs, Duration::from_millis(300)).await;
}

/// A watcher away (its server restarted, its reconnection slow) while 1,000 changes happen
/// receives exactly those 1,000 changes, in order, once it is back.
#[tokio::test]
async fn a_watcher_away_during_a_thousand_changes_receives_them_all() {
    let dir = std::env::temp_dir().join(format!("mqkv-client-thousand-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut server = Server::start_durable(&dir);
    let options = server
        .options("obs-thousand")
        .reconnect_delay(Duration::from_secs(2), Duration::from_secs(3));
    let observer = Client::connect(options).await.unwrap();
    observer.set("counter", "0").await.unwrap();
    let mut obs = observer.observe("counter").await.unwrap();

    server.restart();
    let writer = server.client("obs-thousand-writer").await;
    for i in 1..=1000 {
        writer.set("counter", i.to_string()).await.unwrap();
    }
    let mut last = None;
    for i in 1..=1000 {
        let n = next(&mut obs).await;
        assert_eq!(n.operation, set_of(&i.to_string()), "change {i}");
        assert!(!n.synthesized);
        assert!(last.as_ref().is_none_or(|l| *l < n.version), "in order");
        last = Some(n.version);
    }
    nothing_within(&mut obs, Duration::from_millis(300)).await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
