//! SCAN (key listing) through `state_store::Client::list_keys`, which only the 1.5.0-beta1 SDK
//! has. Expected semantics: wire-compat doc section 6.1 — glob over the whole key, anchored,
//! case-sensitive; `*` crosses `/`; `?` is one character; `[...]`, ranges and `[!...]`
//! classes; `^` is not negation; `[*]` escapes; expired and deleted keys are not listed.

#[path = "../../common/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use azure_iot_operations_services::state_store::{self, ErrorKind, SetOptions};

use support::*;

/// Upper bound the official SDK tests put on the pages of one scan.
const MAX_PAGES: usize = 64;

struct Scan {
    keys: Vec<Vec<u8>>,
    pages: usize,
}

/// Walks every page of `pattern` and returns the keys in the order received.
async fn scan(ss: &state_store::Client, pattern: &[u8]) -> Scan {
    let mut pager = ss.list_keys(pattern.to_vec(), TIMEOUT).expect("list_keys");
    let mut keys = Vec::new();
    let mut pages = 0;
    while let Some(page) = pager.next().await.unwrap_or_else(|e| {
        panic!(
            "SCAN {:?} page {pages}: {e:?}",
            String::from_utf8_lossy(pattern)
        )
    }) {
        pages += 1;
        assert!(
            pages <= 10_000,
            "SCAN {:?} does not terminate",
            String::from_utf8_lossy(pattern)
        );
        keys.extend(page);
    }
    // The pager is done: no further request, no further page.
    assert!(pager.next().await.unwrap().is_none());
    Scan { keys, pages }
}

/// Scans `pattern`, checks there are no duplicates and returns the set of keys.
async fn scan_set(ss: &state_store::Client, pattern: &[u8]) -> BTreeSet<Vec<u8>> {
    let s = scan(ss, pattern).await;
    let set: BTreeSet<Vec<u8>> = s.keys.iter().cloned().collect();
    assert_eq!(
        set.len(),
        s.keys.len(),
        "SCAN {:?} returned a key more than once",
        String::from_utf8_lossy(pattern)
    );
    set
}

fn set_of(keys: &[&str]) -> BTreeSet<Vec<u8>> {
    keys.iter().map(|k| k.as_bytes().to_vec()).collect()
}

fn show(set: &BTreeSet<Vec<u8>>) -> Vec<String> {
    set.iter()
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect()
}

async fn put(ss: &state_store::Client, key: &[u8]) {
    assert!(
        ss.set(
            key.to_vec(),
            b"v".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_paginates_over_many_keys() {
    let server = Server::start("scan_paginates_over_many_keys");
    let c = AioClient::connect(&server, &client_id("scanpage", "a")).await;
    let ss = &c.state_store;

    // Nothing stored yet: one empty final page.
    let empty = scan(ss, b"*").await;
    assert!(empty.keys.is_empty());

    let wanted: BTreeSet<Vec<u8>> = (0..250)
        .map(|i| format!("page/{i:04}").into_bytes())
        .collect();
    let others: BTreeSet<Vec<u8>> = (0..120)
        .map(|i| format!("zz-other/{i:04}").into_bytes())
        .collect();
    // Interleave the writes so matching keys are not contiguous in insertion order.
    for (i, k) in wanted.iter().enumerate() {
        put(ss, k).await;
        if let Some(o) = others.iter().nth(i) {
            put(ss, o).await;
        }
    }

    let s = scan(ss, b"page/*").await;
    eprintln!("SCAN page/*: {} keys in {} pages", s.keys.len(), s.pages);
    let got: BTreeSet<Vec<u8>> = s.keys.iter().cloned().collect();
    assert_eq!(
        got.len(),
        s.keys.len(),
        "a key was returned twice across pages"
    );
    assert_eq!(
        got, wanted,
        "SCAN page/* must return exactly the 250 matching keys"
    );
    assert!(
        s.pages <= MAX_PAGES,
        "{} pages for 250 keys; the SDK tests allow {MAX_PAGES}",
        s.pages
    );

    let all = scan(ss, b"*").await;
    eprintln!("SCAN *: {} keys in {} pages", all.keys.len(), all.pages);
    let all_set: BTreeSet<Vec<u8>> = all.keys.iter().cloned().collect();
    assert_eq!(
        all_set.len(),
        all.keys.len(),
        "a key was returned twice across pages"
    );
    let expected: BTreeSet<Vec<u8>> = wanted.union(&others).cloned().collect();
    assert_eq!(all_set, expected);

    // Two scans with nothing changed in between agree.
    assert_eq!(scan_set(ss, b"zz-other/*").await, others);
    assert_eq!(
        scan_set(ss, b"page/01*").await,
        (100..200)
            .map(|i| format!("page/{i:04}").into_bytes())
            .collect()
    );

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_glob_patterns() {
    let server = Server::start("scan_glob_patterns");
    let c = AioClient::connect(&server, &client_id("scanglob", "a")).await;
    let ss = &c.state_store;

    let keys = [
        "g/a1", "g/b1", "g/c1", "g/d1", "g/A1", "g/^1", "g/*1", "g/?1", "g/1", "g/aa1", "g/ab",
        "g/x/y", "g/x", "other/a1", "G/a1",
    ];
    for k in keys {
        put(ss, k.as_bytes()).await;
    }

    let cases: &[(&str, &[&str])] = &[
        // `*`: any run of characters, including none and including `/`.
        (
            "g/*",
            &[
                "g/a1", "g/b1", "g/c1", "g/d1", "g/A1", "g/^1", "g/*1", "g/?1", "g/1", "g/aa1",
                "g/ab", "g/x/y", "g/x",
            ],
        ),
        ("g/a*", &["g/a1", "g/aa1", "g/ab"]),
        ("g/*/*", &["g/x/y"]),
        (
            "*1",
            &[
                "g/a1", "g/b1", "g/c1", "g/d1", "g/A1", "g/^1", "g/*1", "g/?1", "g/1", "g/aa1",
                "other/a1", "G/a1",
            ],
        ),
        ("*", &keys),
        // `?`: exactly one character.
        (
            "g/?1",
            &[
                "g/a1", "g/b1", "g/c1", "g/d1", "g/A1", "g/^1", "g/*1", "g/?1",
            ],
        ),
        ("g/a?", &["g/a1", "g/ab"]),
        ("g/??1", &["g/aa1"]),
        ("?/a1", &["g/a1", "G/a1"]),
        // Classes and ranges.
        ("g/[abc]1", &["g/a1", "g/b1", "g/c1"]),
        ("g/[a-c]1", &["g/a1", "g/b1", "g/c1"]),
        ("g/[a-cA]1", &["g/a1", "g/b1", "g/c1", "g/A1"]),
        // Negated classes with `!`.
        (
            "g/[!a]1",
            &["g/b1", "g/c1", "g/d1", "g/A1", "g/^1", "g/*1", "g/?1"],
        ),
        ("g/[!a-c]1", &["g/d1", "g/A1", "g/^1", "g/*1", "g/?1"]),
        // `^` is an ordinary class member, not negation.
        ("g/[^a]1", &["g/a1", "g/^1"]),
        // Metacharacters made literal by a class.
        ("g/[*]1", &["g/*1"]),
        ("g/[?]1", &["g/?1"]),
        // Anchored at both ends, case-sensitive, literal patterns.
        ("g/x", &["g/x"]),
        ("/x", &[]),
        ("g/", &[]),
        ("g/A*", &["g/A1"]),
        ("G/*", &["G/a1"]),
        ("g/a1", &["g/a1"]),
        ("nomatch*", &[]),
    ];

    let mut failures = Vec::new();
    for (pattern, expected) in cases {
        let got = scan_set(ss, pattern.as_bytes()).await;
        let want = set_of(expected);
        if got != want {
            failures.push(format!(
                "SCAN {pattern:?}: expected {:?}, got {:?}",
                show(&want),
                show(&got)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "glob mismatches:\n{}",
        failures.join("\n")
    );

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_question_mark_is_one_character_not_one_byte() {
    let server = Server::start("scan_question_mark_is_one_character_not_one_byte");
    let c = AioClient::connect(&server, &client_id("scanutf8", "a")).await;
    let ss = &c.state_store;
    put(ss, "u/é1".as_bytes()).await; // 'é' is two bytes in UTF-8
    put(ss, "u/e1".as_bytes()).await;
    assert_eq!(
        scan_set(ss, "u/?1".as_bytes()).await,
        set_of(&["u/é1", "u/e1"])
    );
    assert_eq!(scan_set(ss, "u/[é]1".as_bytes()).await, set_of(&["u/é1"]));
    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_reflects_deletes_and_expiry() {
    let server = Server::start("scan_reflects_deletes_and_expiry");
    let c = AioClient::connect(&server, &client_id("scanchg", "a")).await;
    let ss = &c.state_store;

    for i in 0..20 {
        put(ss, format!("chg/{i:02}").as_bytes()).await;
    }
    for i in 0..5 {
        let opts = SetOptions {
            // Long enough that the writes and the paged SCAN below finish well inside it.
            expires: Some(Duration::from_millis(2500)),
            ..Default::default()
        };
        assert!(
            ss.set(
                format!("chg/exp{i}").into_bytes(),
                b"e".to_vec(),
                TIMEOUT,
                None,
                opts
            )
            .await
            .unwrap()
            .response
        );
    }
    assert_eq!(
        scan_set(ss, b"chg/*").await.len(),
        25,
        "fresh keys with a PX are listed"
    );

    // Delete some, VDEL one, add some, let the PX keys expire.
    for i in [0, 3, 7] {
        assert_eq!(
            ss.del(format!("chg/{i:02}").into_bytes(), None, TIMEOUT)
                .await
                .unwrap()
                .response,
            1
        );
    }
    assert_eq!(
        ss.vdel(b"chg/10".to_vec(), b"v".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    put(ss, b"chg/new").await;
    tokio::time::sleep(Duration::from_millis(3500)).await;

    let mut expected: BTreeSet<Vec<u8>> = (0..20)
        .filter(|i| ![0, 3, 7, 10].contains(i))
        .map(|i| format!("chg/{i:02}").into_bytes())
        .collect();
    expected.insert(b"chg/new".to_vec());
    assert_eq!(show(&scan_set(ss, b"chg/*").await), show(&expected));
    assert!(
        scan_set(ss, b"chg/exp*").await.is_empty(),
        "expired keys must not be listed"
    );

    c.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_binary_and_large_keys() {
    let server = Server::start("scan_binary_and_large_keys");
    let c = AioClient::connect(&server, &client_id("scanbin", "a")).await;
    let ss = &c.state_store;

    let bin = b"bin/\x00\r\n$3\r\n*1\r\n".to_vec();
    let big: Vec<u8> = [b"big/".to_vec(), vec![b'x'; 6_496]].concat();
    assert_eq!(big.len(), 6_500);
    put(ss, &bin).await;
    put(ss, &big).await;
    put(ss, b"plain").await;

    let got = scan_set(ss, b"bin/*").await;
    assert_eq!(
        got,
        [bin.clone()].into_iter().collect(),
        "binary key must come back byte for byte"
    );
    let got = scan_set(ss, b"big/*").await;
    assert_eq!(
        got,
        [big.clone()].into_iter().collect(),
        "6,500-byte key must come back whole"
    );
    let got = scan_set(ss, b"*").await;
    assert_eq!(got, [bin, big, b"plain".to_vec()].into_iter().collect());

    c.close().await;
}

/// The client refuses an empty pattern itself; kept so a change in the SDK is noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_empty_pattern_rejected_by_client() {
    let server = Server::start("scan_empty_pattern_rejected_by_client");
    let c = AioClient::connect(&server, &client_id("scanempty", "a")).await;
    match c.state_store.list_keys(Vec::new(), TIMEOUT) {
        Err(e) => assert!(matches!(e.kind(), ErrorKind::InvalidArgument(_)), "{e:?}"),
        Ok(_) => panic!("empty SCAN pattern accepted by the client"),
    }
    c.close().await;
}
