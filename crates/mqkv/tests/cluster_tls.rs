//! A cluster of real `mqkv serve` processes whose links are mutual TLS: each node with a
//! certificate of its own from the cluster's CA serves the one store, a node whose certificate
//! another CA issued is kept out, and the files are read again on reload.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::cluster::{bulk, cli, member, ok, text, TestCluster};
use common::store::Client;
use mqkv_testkit::pki::TestCa;

fn tls_flags(cert: &Path, key: &Path, ca: &Path) -> Vec<String> {
    [
        "--cluster-tls-cert",
        path(cert),
        "--cluster-tls-key",
        path(key),
        "--cluster-tls-ca",
        path(ca),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_linked_by_mutual_tls_serve_one_store_and_keep_out_another_ca() {
    let files = TestCluster::root("tls-files");
    let cluster_ca = TestCa::new(&files, "cluster-ca");
    let stranger_ca = TestCa::new(&files, "stranger-ca");
    let certs: Vec<(PathBuf, PathBuf)> = (1..=3)
        .map(|id| cluster_ca.issue(&files, &format!("node-{id}")))
        .collect();
    let mut cluster = TestCluster::start_each("tls", 3, |id| {
        let (cert, key) = &certs[id as usize - 1];
        tls_flags(cert, key, &cluster_ca.cert)
    });
    let leader = cluster.wait_for_leader(1, Duration::from_secs(15));

    // A write through one node is read through every node.
    let mut writer = Client::connect("tls-writer", cluster.port(leader)).await;
    let a = writer.call(&[b"SET", b"k", b"over-tls"]).await;
    assert_eq!(text(&a.payload), "+OK\r\n");
    for node in [1, 2, 3] {
        let mut reader = Client::connect(&format!("tls-reader-{node}"), cluster.port(node)).await;
        let a = reader.call(&[b"GET", b"k"]).await;
        assert_eq!(bulk(&a.payload).as_deref(), Some("over-tls"), "node {node}");
    }

    // The files are read again on reload; a certificate that does not load is named, and the
    // one in use stays: the links keep working.
    let port = cluster.port(1).to_string();
    assert_eq!(ok(cli(&["reload", "--port", &port])).trim(), "reloaded");
    let (cert1, key1) = &certs[0];
    let good = std::fs::read(cert1).expect("read");
    std::fs::write(cert1, "not a certificate").expect("write");
    let out = cli(&["reload", "--port", &port]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!("cluster_tls {}", cert1.display())),
        "{said}"
    );
    std::fs::write(cert1, &good).expect("write");
    let (fresh_cert, fresh_key) = cluster_ca.issue(&files, "node-1-renewed");
    std::fs::copy(&fresh_cert, cert1).expect("copy");
    std::fs::copy(&fresh_key, key1).expect("copy");
    assert_eq!(ok(cli(&["reload", "--port", &port])).trim(), "reloaded");
    let a = writer.call(&[b"SET", b"k2", b"after-reload"]).await;
    assert_eq!(text(&a.payload), "+OK\r\n");

    // Node 3 comes back with a certificate of another CA, and a fresh data directory: the
    // other two keep their quorum without it, and say why it is not with them.
    cluster.kill9(3);
    let (cert, key) = stranger_ca.issue(&files, "node-3-stranger");
    cluster.nodes[2].extra = tls_flags(&cert, &key, &stranger_ca.cert);
    let _ = std::fs::remove_dir_all(&cluster.nodes[2].dir);
    cluster.restart(3);
    let survivor = cluster.wait_for_leader(1, Duration::from_secs(15));
    let mut c = Client::connect("tls-writer-2", cluster.port(survivor)).await;
    let a = c.call(&[b"SET", b"k3", b"two-of-three"]).await;
    assert_eq!(text(&a.payload), "+OK\r\n");
    let start = Instant::now();
    let why = loop {
        let status = cluster.status(survivor).expect("status");
        let three = member(&status, 3);
        if let Some(e) = three["error"]
            .as_str()
            .filter(|e| e.contains("certificate"))
        {
            break e.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "node 3's refusal is not reported: {three}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(why.contains("TLS"), "{why}");
    // Node 3 received none of the writes: it has no leader, so it refuses rather than answer.
    let mut c3 = Client::connect("outsider", cluster.port(3)).await;
    let a = c3.call(&[b"GET", b"k3"]).await;
    assert_eq!(a.user("__stat"), Some("503"), "{:?}", text(&a.payload));
    let _ = std::fs::remove_dir_all(&files);
}
