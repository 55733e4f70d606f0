//! Many calls in flight through one client.

use super::*;

/// An application making concurrent calls through one client: the requests share one MQTT
/// connection, all in flight at once. Every call gets its own answer, every write its own
/// version, reads see the writes, and of racing `SET NX` calls exactly one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_through_one_client() {
    const N: usize = 100;
    let server = Server::start("concurrent_calls_through_one_client");
    let c = AioClient::connect(&server, &client_id("concurrent", "a")).await;
    let key = |i: usize| format!("concurrent/{i}").into_bytes();
    let value = |i: usize| format!("value-{i}").into_bytes();

    let mut sets = tokio::task::JoinSet::new();
    for i in 0..N {
        let ss = c.state_store.clone();
        sets.spawn(async move {
            let r = ss
                .set(key(i), value(i), TIMEOUT, None, SetOptions::default())
                .await;
            (i, r)
        });
    }
    let mut versions = vec![None; N];
    while let Some(joined) = sets.join_next().await {
        let (i, r) = joined.expect("SET task");
        let r = r.unwrap_or_else(|e| panic!("SET {i}: {e:?}"));
        assert!(r.response, "SET {i} applied");
        versions[i] = Some(format!(
            "{:?}",
            r.version.expect("a SET answer has a version")
        ));
    }
    let distinct: std::collections::HashSet<_> = versions.iter().flatten().collect();
    assert_eq!(distinct.len(), N, "every write has a version of its own");

    let mut gets = tokio::task::JoinSet::new();
    for i in 0..N {
        let ss = c.state_store.clone();
        gets.spawn(async move { (i, ss.get(key(i), TIMEOUT).await) });
    }
    while let Some(joined) = gets.join_next().await {
        let (i, r) = joined.expect("GET task");
        let r = r.unwrap_or_else(|e| panic!("GET {i}: {e:?}"));
        assert_eq!(r.response, Some(value(i)), "GET {i}");
        assert_eq!(
            r.version.map(|v| format!("{v:?}")),
            versions[i],
            "GET {i} reads the version its SET answered"
        );
    }

    let mut racers = tokio::task::JoinSet::new();
    for i in 0..N {
        let ss = c.state_store.clone();
        racers.spawn(async move {
            ss.set(b"concurrent/race".to_vec(), value(i), TIMEOUT, None, nx())
                .await
                .map(|r| r.response)
        });
    }
    let mut won = 0;
    while let Some(joined) = racers.join_next().await {
        if joined.expect("SET NX task").expect("SET NX answered") {
            won += 1;
        }
    }
    assert_eq!(won, 1, "exactly one of {N} racing SET NX calls is applied");
    c.close().await;
}
