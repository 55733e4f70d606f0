//! SET / GET / DEL / VDEL and versions.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_del_with_versions() {
    let server = Server::start("set_get_del_with_versions");
    let c = AioClient::connect(&server, &client_id("crud", "a")).await;
    let ss = &c.state_store;
    let key = b"crud/key".to_vec();

    // GET of a key that was never set: None and no version (GET miss carries no __ts).
    let miss = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(miss.response, None);
    assert!(
        miss.version.is_none(),
        "GET miss must not carry __ts, got {:?}",
        miss.version
    );

    let before_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let set1 = ss
        .set(
            key.clone(),
            b"v1".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set1.response, "plain SET of a new key must be applied");
    let v1 = set1
        .version
        .expect("SET +OK must carry the key version in __ts");
    assert!(
        hlc_ms(&v1) >= before_ms,
        "version {v1} is older than the wall clock before the request ({before_ms} ms)"
    );

    // GET returns the value and exactly the version of the SET that wrote it.
    let get1 = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(get1.response.as_deref(), Some(&b"v1"[..]));
    assert_eq!(
        get1.version.as_ref(),
        Some(&v1),
        "GET hit must return the SET version"
    );
    // Reading does not change the version.
    let get1b = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(get1b.version.as_ref(), Some(&v1));

    // Overwrite: new version strictly later, same server node id.
    let set2 = ss
        .set(
            key.clone(),
            b"v2".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set2.response);
    let v2 = set2.version.expect("SET must carry __ts");
    assert_later(&v2, &v1, "second SET of the key");
    assert_eq!(
        v2.node_id, v1.node_id,
        "server node id must be stable across versions"
    );
    let get2 = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(get2.response.as_deref(), Some(&b"v2"[..]));
    assert_eq!(get2.version.as_ref(), Some(&v2));

    // Many sequential writes: versions strictly increase.
    let mut last = v2;
    for i in 0..10 {
        let r = ss
            .set(
                key.clone(),
                format!("v{i}").into_bytes(),
                TIMEOUT,
                None,
                SetOptions::default(),
            )
            .await
            .unwrap();
        let v = r.version.expect("SET must carry __ts");
        assert_later(&v, &last, "sequential SET");
        last = v;
    }

    // Binary-safe value: CR, LF, NUL and RESP-looking bytes survive untouched.
    let tricky = b"\r\n$3\r\nSET\r\n\0\xff*2\r\n".to_vec();
    assert!(
        ss.set(
            key.clone(),
            tricky.clone(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert_eq!(
        ss.get(key.clone(), TIMEOUT).await.unwrap().response,
        Some(tricky)
    );

    // DEL of an existing key: 1; then it is gone; DEL again: 0.
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        1
    );
    let gone = ss.get(key.clone(), TIMEOUT).await.unwrap();
    assert_eq!(gone.response, None);
    assert!(
        gone.version.is_none(),
        "GET miss after DEL must not carry __ts"
    );
    assert_eq!(
        ss.del(key.clone(), None, TIMEOUT).await.unwrap().response,
        0
    );
    assert_eq!(
        ss.del(b"crud/never".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );

    // Re-creating the key after DEL gets a version later than every earlier one.
    let set3 = ss
        .set(
            key.clone(),
            b"v3".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set3.response);
    assert_later(set3.version.as_ref().unwrap(), &last, "SET after DEL");

    // SET with `aio-persistence: true` (persist option) is accepted like any other SET.
    let persisted = b"crud/persisted".to_vec();
    let opts = SetOptions {
        persist: true,
        ..Default::default()
    };
    assert!(
        ss.set(persisted.clone(), b"p".to_vec(), TIMEOUT, None, opts)
            .await
            .unwrap()
            .response
    );
    assert_eq!(
        ss.get(persisted.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"p"[..])
    );

    // Keys are independent.
    let other = b"crud/other".to_vec();
    assert!(
        ss.set(
            other.clone(),
            b"o".to_vec(),
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
            .as_deref(),
        Some(&b"v3"[..])
    );
    assert_eq!(
        ss.get(other.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"o"[..])
    );

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vdel_compares_value() {
    let server = Server::start("vdel_compares_value");
    let c = AioClient::connect(&server, &client_id("vdel", "a")).await;
    let ss = &c.state_store;
    let key = b"vdel/key".to_vec();

    // Absent key: 0.
    assert_eq!(
        ss.vdel(key.clone(), b"x".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );

    assert!(
        ss.set(
            key.clone(),
            b"right".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );

    // Value mismatch: -1 and the key survives.
    assert_eq!(
        ss.vdel(key.clone(), b"wrong".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    // A prefix of the value is not equal to it either.
    assert_eq!(
        ss.vdel(key.clone(), b"righ".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    assert_eq!(
        ss.vdel(key.clone(), b"right!".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        -1
    );
    assert_eq!(
        ss.get(key.clone(), TIMEOUT)
            .await
            .unwrap()
            .response
            .as_deref(),
        Some(&b"right"[..])
    );

    // Match: 1 and the key is gone.
    assert_eq!(
        ss.vdel(key.clone(), b"right".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_eq!(ss.get(key.clone(), TIMEOUT).await.unwrap().response, None);
    assert_eq!(
        ss.vdel(key.clone(), b"right".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );

    c.close().await;
}
