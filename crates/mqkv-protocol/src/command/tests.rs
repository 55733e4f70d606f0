//! Tests of request parsing and encoding.

use super::*;
use crate::resp::put_bulk;
use proptest::prelude::*;

fn b(s: &'static [u8]) -> Bytes {
    Bytes::from_static(s)
}

/// Builds a request payload the way a client would.
fn req(args: &[&[u8]]) -> Vec<u8> {
    let mut out = BytesMut::new();
    put_array_header(&mut out, args.len());
    for arg in args {
        put_bulk(&mut out, arg);
    }
    out.to_vec()
}

fn set(key: &'static [u8], value: &'static [u8]) -> Command {
    Command::Set {
        key: b(key),
        value: b(value),
        condition: None,
        px_ms: None,
    }
}

#[test]
fn wire_compat_sdk_examples() {
    assert_eq!(
        parse_request(b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n"),
        Ok(Command::Set {
            key: b(b"testkey"),
            value: b(b"testvalue"),
            condition: Some(SetCondition::Nx),
            px_ms: None,
        })
    );
    assert_eq!(
        parse_request(b"*2\r\n$3\r\nGET\r\n$5\r\nnokey\r\n"),
        Ok(Command::Get { key: b(b"nokey") })
    );
    assert_eq!(
        parse_request(b"*3\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n$4\r\nSTOP\r\n"),
        Ok(Command::KeyNotify {
            key: b(b"k"),
            stop: true
        })
    );
    assert_eq!(
        parse_request(b"*2\r\n$4\r\nSCAN\r\n$4\r\nkey*\r\n"),
        Ok(Command::Scan {
            pattern: b(b"key*"),
            token: None
        })
    );
}

#[test]
fn article_lower_case_examples() {
    assert_eq!(
        parse_request(b"*3\r\n$3\r\nset\r\n$7\r\nSETKEY2\r\n$6\r\nVALUE5\r\n"),
        Ok(set(b"SETKEY2", b"VALUE5"))
    );
    assert_eq!(
        parse_request(b"*2\r\n$3\r\nget\r\n$7\r\nSETKEY2\r\n"),
        Ok(Command::Get { key: b(b"SETKEY2") })
    );
    assert_eq!(
        parse_request(b"*2\r\n$3\r\ndel\r\n$7\r\nSETKEY2\r\n"),
        Ok(Command::Del { key: b(b"SETKEY2") })
    );
    assert_eq!(
        parse_request(b"*3\r\n$4\r\nvdel\r\n$7\r\nSETKEY2\r\n$3\r\nABC\r\n"),
        Ok(Command::VDel {
            key: b(b"SETKEY2"),
            value: b(b"ABC")
        })
    );
    assert_eq!(
        parse_request(&req(&[b"KeyNotify", b"k", b"sToP"])),
        Ok(Command::KeyNotify {
            key: b(b"k"),
            stop: true
        })
    );
}

#[test]
fn keys_and_values_are_binary_safe() {
    let key: &[u8] = b"\x00\r\n\xff";
    let value: &[u8] = b"\r\n$3\r\n*";
    assert_eq!(
        parse_request(&req(&[b"SET", key, value])),
        Ok(Command::Set {
            key: Bytes::from_static(key),
            value: Bytes::from_static(value),
            condition: None,
            px_ms: None,
        })
    );
}

#[test]
fn empty_value_and_large_key_are_legal() {
    assert_eq!(
        parse_request(&req(&[b"SET", b"k", b""])),
        Ok(set(b"k", b""))
    );
    let key = vec![0u8; 6_500];
    let value = vec![7u8; 65_000];
    let cmd = parse_request(&req(&[b"SET", &key, &value])).unwrap();
    assert_eq!(cmd.key().len(), 6_500);
}

#[test]
fn parse_bytes_is_zero_copy() {
    let payload = Bytes::from(req(&[b"GET", b"the-key"]));
    let Command::Get { key } = parse_request_bytes(&payload).unwrap() else {
        panic!("not a GET");
    };
    let range = payload.as_ptr_range();
    assert!(
        range.contains(&key.as_ptr()),
        "key must point into the payload"
    );
}

#[test]
fn unknown_and_malformed() {
    assert_eq!(
        parse_request(&req(&[b"MSET", b"k"])),
        Err(ErrorKind::UnknownCommand)
    );
    assert_eq!(parse_request(&req(&[b""])), Err(ErrorKind::UnknownCommand));
    assert_eq!(
        parse_request(&req(&[b"GETX", b"k"])),
        Err(ErrorKind::UnknownCommand)
    );
    assert_eq!(parse_request(b"*0\r\n"), Err(ErrorKind::SyntaxError));
    assert_eq!(parse_request(b""), Err(ErrorKind::SyntaxError));
    assert_eq!(parse_request(b"GET k\r\n"), Err(ErrorKind::SyntaxError));
    assert_eq!(parse_request(b"+OK\r\n"), Err(ErrorKind::SyntaxError));
    assert_eq!(
        parse_request(b"*2\r\n$3\r\nGET\r\n$5\r\nk\r\n"),
        Err(ErrorKind::SyntaxError)
    );
    assert_eq!(
        parse_request(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\r\n"),
        Err(ErrorKind::SyntaxError)
    );
    assert_eq!(
        parse_request(b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
        Err(ErrorKind::SyntaxError)
    );
    assert_eq!(
        parse_request(b"*999999999999\r\n$3\r\nGET\r\n"),
        Err(ErrorKind::SyntaxError)
    );
}

#[test]
fn wrong_number_of_arguments() {
    use ErrorKind::WrongNumberOfArguments as W;
    let cases: &[&[&[u8]]] = &[
        &[b"GET"],
        &[b"GET", b"a", b"b"],
        &[b"DEL"],
        &[b"DEL", b"a", b"b"],
        &[b"SET"],
        &[b"SET", b"k"],
        &[b"VDEL"],
        &[b"VDEL", b"k"],
        &[b"VDEL", b"k", b"v", b"x"],
        &[b"KEYNOTIFY"],
        &[b"KEYNOTIFY", b"k", b"STOP", b"x"],
        &[b"SCAN"],
        &[b"SCAN", b"*", b"t", b"x"],
    ];
    for args in cases {
        assert_eq!(parse_request(&req(args)), Err(W), "{args:?}");
    }
}

#[test]
fn empty_key_is_key_length_zero() {
    use ErrorKind::KeyLengthZero as Z;
    assert_eq!(parse_request(b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n"), Err(Z));
    assert_eq!(parse_request(&req(&[b"SET", b"", b"v"])), Err(Z));
    assert_eq!(parse_request(&req(&[b"DEL", b""])), Err(Z));
    assert_eq!(parse_request(&req(&[b"VDEL", b"", b"v"])), Err(Z));
    assert_eq!(parse_request(&req(&[b"KEYNOTIFY", b""])), Err(Z));
    assert_eq!(parse_request(&req(&[b"SCAN", b""])), Err(Z));
    // The argument count is checked first.
    assert_eq!(
        parse_request(&req(&[b"GET", b"", b""])),
        Err(ErrorKind::WrongNumberOfArguments)
    );
    // An empty key beats a bad option.
    assert_eq!(parse_request(&req(&[b"SET", b"", b"v", b"XX"])), Err(Z));
}

#[test]
fn keynotify_option_must_be_stop() {
    assert_eq!(
        parse_request(&req(&[b"KEYNOTIFY", b"k", b"STAP"])),
        Err(ErrorKind::SyntaxError)
    );
    assert_eq!(
        parse_request(&req(&[b"KEYNOTIFY", b"k"])),
        Ok(Command::KeyNotify {
            key: b(b"k"),
            stop: false
        })
    );
}

#[test]
fn scan_token_is_opaque_binary() {
    assert_eq!(
        parse_request(&req(&[b"SCAN", b"*", b"\x00\xffx"])),
        Ok(Command::Scan {
            pattern: b(b"*"),
            token: Some(b(b"\x00\xffx"))
        })
    );
}

#[test]
fn set_options_in_any_order_and_case() {
    let expect = |condition, px_ms| Command::Set {
        key: b(b"k"),
        value: b(b"v"),
        condition,
        px_ms,
    };
    let cases: &[(&[&[u8]], Command)] = &[
        (
            &[b"SET", b"k", b"v", b"NEX"],
            expect(Some(SetCondition::Nex), None),
        ),
        (
            &[b"SET", b"k", b"v", b"nx"],
            expect(Some(SetCondition::Nx), None),
        ),
        (&[b"SET", b"k", b"v", b"PX", b"10"], expect(None, Some(10))),
        (
            &[b"SET", b"k", b"v", b"NEX", b"PX", b"2000"],
            expect(Some(SetCondition::Nex), Some(2000)),
        ),
        (
            &[b"SET", b"k", b"v", b"px", b"2000", b"Nex"],
            expect(Some(SetCondition::Nex), Some(2000)),
        ),
        (
            &[b"SET", b"k", b"v", b"PX", b"1500.5", b"NX"],
            expect(Some(SetCondition::Nx), Some(1500)),
        ),
        (
            &[b"SET", b"k", b"v", b"PX", b"1500,999"],
            expect(None, Some(1500)),
        ),
        (&[b"SET", b"k", b"v", b"PX", b"0007"], expect(None, Some(7))),
        (&[b"SET", b"k", b"v", b"PX", b"1.0"], expect(None, Some(1))),
    ];
    for (args, want) in cases {
        assert_eq!(parse_request(&req(args)).as_ref(), Ok(want), "{args:?}");
    }
}

#[test]
fn set_option_errors() {
    let cases: &[&[&[u8]]] = &[
        &[b"SET", b"k", b"v", b"NX", b"NEX"],
        &[b"SET", b"k", b"v", b"NEX", b"NX"],
        &[b"SET", b"k", b"v", b"NX", b"NX"],
        &[b"SET", b"k", b"v", b"PX", b"1", b"PX", b"2"],
        &[b"SET", b"k", b"v", b"PX"],
        &[b"SET", b"k", b"v", b"NX", b"PX"],
        &[b"SET", b"k", b"v", b"PX", b"0"],
        &[b"SET", b"k", b"v", b"PX", b"0.9"],
        &[b"SET", b"k", b"v", b"PX", b"-5"],
        &[b"SET", b"k", b"v", b"PX", b"+5"],
        &[b"SET", b"k", b"v", b"PX", b"abc"],
        &[b"SET", b"k", b"v", b"PX", b""],
        &[b"SET", b"k", b"v", b"PX", b"1e3"],
        &[b"SET", b"k", b"v", b"PX", b"1."],
        &[b"SET", b"k", b"v", b"PX", b".5"],
        &[b"SET", b"k", b"v", b"PX", b"1.5.5"],
        &[b"SET", b"k", b"v", b"PX", b"1,5,5"],
        &[b"SET", b"k", b"v", b"PX", b" 5"],
        &[b"SET", b"k", b"v", b"PX", b"99999999999999999999999"],
        &[b"SET", b"k", b"v", b"PX", b"\xff"],
        &[b"SET", b"k", b"v", b"EX", b"5"],
        &[b"SET", b"k", b"v", b"XX"],
        &[b"SET", b"k", b"v", b"NEX", b"v"],
        &[b"SET", b"k", b"v", b"GET"],
    ];
    for args in cases {
        assert_eq!(
            parse_request(&req(args)),
            Err(ErrorKind::SyntaxError),
            "{args:?}"
        );
    }
}

#[test]
fn encode_matches_sdk_bytes() {
    let cmd = Command::Set {
        key: b(b"testkey"),
        value: b(b"testvalue"),
        condition: Some(SetCondition::Nx),
        px_ms: None,
    };
    assert_eq!(
        &cmd.encode()[..],
        b"*4\r\n$3\r\nSET\r\n$7\r\ntestkey\r\n$9\r\ntestvalue\r\n$2\r\nNX\r\n"
    );
    let cmd = Command::Set {
        key: b(b"lock"),
        value: b(b"me"),
        condition: Some(SetCondition::Nex),
        px_ms: Some(10_000),
    };
    assert_eq!(
        &cmd.encode()[..],
        b"*6\r\n$3\r\nSET\r\n$4\r\nlock\r\n$2\r\nme\r\n$3\r\nNEX\r\n$2\r\nPX\r\n$5\r\n10000\r\n"
    );
    let cmd = Command::Set {
        key: b(b"k"),
        value: b(b""),
        condition: None,
        px_ms: Some(5),
    };
    assert_eq!(
        &cmd.encode()[..],
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$2\r\nPX\r\n$1\r\n5\r\n"
    );
    assert_eq!(
        &Command::Get { key: b(b"k") }.encode()[..],
        b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"
    );
    assert_eq!(
        &Command::Del { key: b(b"k") }.encode()[..],
        b"*2\r\n$3\r\nDEL\r\n$1\r\nk\r\n"
    );
    assert_eq!(
        &Command::VDel {
            key: b(b"k"),
            value: b(b"v")
        }
        .encode()[..],
        b"*3\r\n$4\r\nVDEL\r\n$1\r\nk\r\n$1\r\nv\r\n"
    );
    assert_eq!(
        &Command::KeyNotify {
            key: b(b"k"),
            stop: false
        }
        .encode()[..],
        b"*2\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n"
    );
    assert_eq!(
        &Command::KeyNotify {
            key: b(b"k"),
            stop: true
        }
        .encode()[..],
        b"*3\r\n$9\r\nKEYNOTIFY\r\n$1\r\nk\r\n$4\r\nSTOP\r\n"
    );
    assert_eq!(
        &Command::Scan {
            pattern: b(b"k*"),
            token: Some(b(b"\x00\xff"))
        }
        .encode()[..],
        b"*3\r\n$4\r\nSCAN\r\n$2\r\nk*\r\n$2\r\n\x00\xff\r\n"
    );
}

#[test]
fn verbs_and_write_flag() {
    assert!(set(b"k", b"v").is_write());
    assert!(Command::Del { key: b(b"k") }.is_write());
    assert!(!Command::Get { key: b(b"k") }.is_write());
    assert!(!Command::KeyNotify {
        key: b(b"k"),
        stop: false
    }
    .is_write());
    assert_eq!(set(b"k", b"v").verb(), "SET");
    assert_eq!(
        Command::Scan {
            pattern: b(b"p"),
            token: None
        }
        .key(),
        &b(b"p")
    );
}

fn arb_bytes(min: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), min..24).prop_map(Bytes::from)
}

pub(crate) fn arb_version() -> impl Strategy<Value = Hlc> {
    (
        0u64..1_000_000_000_000_000,
        0u64..=99_999,
        "[a-z0-9-]{1,12}",
    )
        .prop_map(|(ms, counter, node)| Hlc::new(ms, counter, node.as_str()))
}

pub(crate) fn arb_command() -> impl Strategy<Value = Command> {
    let condition = proptest::option::of(prop_oneof![
        Just(SetCondition::Nx),
        Just(SetCondition::Nex),
        arb_version().prop_map(SetCondition::IfVersion),
    ]);
    prop_oneof![
        (
            arb_bytes(1),
            arb_bytes(0),
            condition,
            proptest::option::of(1u64..=u64::MAX)
        )
            .prop_map(|(key, value, condition, px_ms)| Command::Set {
                key,
                value,
                condition,
                px_ms
            }),
        arb_bytes(1).prop_map(|key| Command::Get { key }),
        arb_bytes(1).prop_map(|key| Command::Del { key }),
        (arb_bytes(1), arb_bytes(0)).prop_map(|(key, value)| Command::VDel { key, value }),
        (arb_bytes(1), any::<bool>()).prop_map(|(key, stop)| Command::KeyNotify { key, stop }),
        (arb_bytes(1), proptest::option::of(arb_bytes(0)))
            .prop_map(|(pattern, token)| Command::Scan { pattern, token }),
        (arb_bytes(1), arb_version())
            .prop_map(|(key, version)| Command::DelIfVersion { key, version }),
        proptest::collection::vec(arb_bytes(1), 1..12).prop_map(|keys| Command::MGet { keys }),
        (arb_bytes(1), any::<bool>())
            .prop_map(|(pattern, stop)| Command::KeyNotifyPattern { pattern, stop }),
        (arb_bytes(1), arb_version())
            .prop_map(|(key, since)| Command::KeyNotifySince { key, since }),
        (arb_bytes(1), arb_version())
            .prop_map(|(pattern, since)| Command::KeyNotifyPatternSince { pattern, since }),
    ]
}

/// The examples of docs/extensions.md, byte for byte.
#[test]
fn extension_examples_of_the_documentation() {
    let v = Hlc::parse("001732270000123:00000:mqkv").expect("version");
    let set = Command::Set {
        key: b(b"config"),
        value: b(b"v2"),
        condition: Some(SetCondition::IfVersion(v.clone())),
        px_ms: None,
    };
    assert_eq!(
        &set.encode()[..],
        b"*5\r\n$3\r\nSET\r\n$6\r\nconfig\r\n$2\r\nv2\r\n$5\r\nIFVER\r\n$26\r\n001732270000123:00000:mqkv\r\n"
    );
    let del = Command::DelIfVersion {
        key: b(b"config"),
        version: Hlc::parse("001732270000456:00000:mqkv").expect("version"),
    };
    assert_eq!(
        &del.encode()[..],
        b"*4\r\n$3\r\nDEL\r\n$6\r\nconfig\r\n$5\r\nIFVER\r\n$26\r\n001732270000456:00000:mqkv\r\n"
    );
    let watch = Command::KeyNotifyPattern {
        pattern: b(b"sensors/*"),
        stop: false,
    };
    assert_eq!(
        &watch.encode()[..],
        b"*3\r\n$9\r\nKEYNOTIFY\r\n$9\r\nsensors/*\r\n$7\r\nPATTERN\r\n"
    );
    let resume = Command::KeyNotifySince {
        key: b(b"door"),
        since: Hlc::parse("001732270000123:00000:mqkv").expect("version"),
    };
    assert_eq!(
        &resume.encode()[..],
        b"*4\r\n$9\r\nKEYNOTIFY\r\n$4\r\ndoor\r\n$5\r\nSINCE\r\n$26\r\n001732270000123:00000:mqkv\r\n"
    );
    let mget = Command::MGet {
        keys: vec![b(b"a"), b(b"b"), b(b"c")],
    };
    assert_eq!(
        &mget.encode()[..],
        b"*4\r\n$4\r\nMGET\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n"
    );
    let answer = crate::Response::Values(vec![
        Some((b(b"1"), v)),
        None,
        Some((
            b(b"three"),
            Hlc::parse("001732270000124:00000:mqkv").expect("version"),
        )),
    ]);
    assert_eq!(
        &answer.encode()[..],
        &b"*3\r\n*2\r\n$1\r\n1\r\n$26\r\n001732270000123:00000:mqkv\r\n$-1\r\n*2\r\n$5\r\nthree\r\n$26\r\n001732270000124:00000:mqkv\r\n"[..]
    );
}

#[test]
fn extension_requests_parse() {
    let v = "001700000000000:00002:node-1";
    assert_eq!(
        parse_request(&req(&[
            b"SET",
            b"k",
            b"v",
            b"IFVER",
            v.as_bytes(),
            b"PX",
            b"10"
        ])),
        Ok(Command::Set {
            key: b(b"k"),
            value: b(b"v"),
            condition: Some(SetCondition::IfVersion(Hlc::new(
                1_700_000_000_000,
                2,
                "node-1"
            ))),
            px_ms: Some(10),
        })
    );
    assert_eq!(
        parse_request(&req(&[b"del", b"k", b"ifver", v.as_bytes()])),
        Ok(Command::DelIfVersion {
            key: b(b"k"),
            version: Hlc::new(1_700_000_000_000, 2, "node-1"),
        })
    );
    assert_eq!(
        parse_request(&req(&[b"MGET", b"a", b"b"])),
        Ok(Command::MGet {
            keys: vec![b(b"a"), b(b"b")]
        })
    );
    // Errors as the store already answers them.
    let e = |args: &[&[u8]]| parse_request(&req(args)).err();
    assert_eq!(
        e(&[b"SET", b"k", b"v", b"IFVER", b"nonsense"]),
        Some(ErrorKind::SyntaxError)
    );
    assert_eq!(
        e(&[b"SET", b"k", b"v", b"IFVER"]),
        Some(ErrorKind::SyntaxError)
    );
    assert_eq!(
        e(&[b"SET", b"k", b"v", b"NX", b"IFVER", v.as_bytes()]),
        Some(ErrorKind::SyntaxError)
    );
    assert_eq!(
        e(&[b"DEL", b"k", b"IFVER", b"nonsense"]),
        Some(ErrorKind::SyntaxError)
    );
    // Other DEL forms answer as they always did.
    assert_eq!(
        e(&[b"DEL", b"k", b"IFVER"]),
        Some(ErrorKind::WrongNumberOfArguments)
    );
    assert_eq!(
        e(&[b"DEL", b"k", b"NOPE", v.as_bytes()]),
        Some(ErrorKind::WrongNumberOfArguments)
    );
    assert_eq!(
        e(&[b"DEL", b"k", b"IFVER", v.as_bytes(), b"x"]),
        Some(ErrorKind::WrongNumberOfArguments)
    );
    assert_eq!(e(&[b"MGET"]), Some(ErrorKind::WrongNumberOfArguments));
    assert_eq!(
        parse_request(&req(&[b"KEYNOTIFY", b"sensors/*", b"pattern"])),
        Ok(Command::KeyNotifyPattern {
            pattern: b(b"sensors/*"),
            stop: false
        })
    );
    assert_eq!(
        parse_request(&req(&[b"KEYNOTIFY", b"sensors/*", b"PATTERN", b"STOP"])),
        Ok(Command::KeyNotifyPattern {
            pattern: b(b"sensors/*"),
            stop: true
        })
    );
    assert_eq!(
        e(&[b"KEYNOTIFY", b"s*", b"PATTERN", b"NOW"]),
        Some(ErrorKind::SyntaxError)
    );
    assert_eq!(
        e(&[b"KEYNOTIFY", b"", b"PATTERN"]),
        Some(ErrorKind::KeyLengthZero)
    );
    assert_eq!(
        parse_request(&req(&[b"KEYNOTIFY", b"k", b"since", v.as_bytes()])),
        Ok(Command::KeyNotifySince {
            key: b(b"k"),
            since: Hlc::new(1_700_000_000_000, 2, "node-1"),
        })
    );
    assert_eq!(
        e(&[b"KEYNOTIFY", b"k", b"SINCE", b"then"]),
        Some(ErrorKind::SyntaxError)
    );
    assert_eq!(
        parse_request(&req(&[
            b"KEYNOTIFY",
            b"s/*",
            b"PATTERN",
            b"SINCE",
            v.as_bytes()
        ])),
        Ok(Command::KeyNotifyPatternSince {
            pattern: b(b"s/*"),
            since: Hlc::new(1_700_000_000_000, 2, "node-1"),
        })
    );
    // AIO's forms answer as they always did.
    assert_eq!(
        e(&[b"KEYNOTIFY", b"k", b"STOP", b"x"]),
        Some(ErrorKind::WrongNumberOfArguments)
    );
    assert_eq!(
        e(&[b"KEYNOTIFY", b"k", b"PATTERN", b"STOP", b"x"]),
        Some(ErrorKind::WrongNumberOfArguments)
    );
    assert_eq!(e(&[b"MGET", b"a", b""]), Some(ErrorKind::KeyLengthZero));
    let many: Vec<Vec<u8>> = (0..=MAX_MGET_KEYS)
        .map(|i| format!("k{i}").into_bytes())
        .collect();
    let mut args: Vec<&[u8]> = vec![b"MGET"];
    args.extend(many.iter().map(Vec::as_slice));
    assert_eq!(e(&args), Some(ErrorKind::WrongNumberOfArguments));
    assert!(parse_request(&req(&args[..args.len() - 1])).is_ok());
}

proptest! {
    #[test]
    fn encode_parse_round_trip(cmd in arb_command()) {
        prop_assert_eq!(parse_request(&cmd.encode()), Ok(cmd));
    }

    /// A buffer that cannot grow, sized by the bound, takes the whole
    /// encoding (writing past it would panic).
    #[test]
    fn encode_into_a_slice_of_the_bound(cmd in arb_command()) {
        let bound = cmd.encoded_len_bound();
        let mut buf = vec![0u8; bound];
        let mut rest = &mut buf[..];
        cmd.encode_into(&mut rest);
        let written = bound - rest.len();
        prop_assert_eq!(&buf[..written], &cmd.encode()[..]);
    }

    /// The pieces a request is hashed from are its encoding, in order.
    #[test]
    fn pieces_are_the_encoding(cmd in arb_command()) {
        let mut joined = Vec::new();
        cmd.encode_pieces(|piece| joined.extend_from_slice(piece));
        prop_assert_eq!(&joined[..], &cmd.encode()[..]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..96)) {
        if let Ok(cmd) = parse_request(&payload) {
            prop_assert_eq!(parse_request(&cmd.encode()), Ok(cmd));
        }
    }

    #[test]
    fn truncated_requests_are_syntax_errors(cmd in arb_command(), cut in any::<prop::sample::Index>()) {
        let bytes = cmd.encode();
        let cut = cut.index(bytes.len());
        prop_assert_eq!(parse_request(&bytes[..cut]), Err(ErrorKind::SyntaxError));
    }
}
