//! Property: a store that is written to and restarted at random answers
//! exactly like one `StateMachine` fed the same entries.

use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Write {
        advance_ms: u64,
        op: OpSpec,
        dedup: Option<u8>,
    },
    Restart,
}

#[derive(Debug, Clone)]
enum OpSpec {
    Set {
        key: u8,
        value: u8,
        condition: Option<SetCondition>,
        px_ms: Option<u64>,
        ft: Option<u8>,
    },
    Del {
        key: u8,
        ft: Option<u8>,
    },
    VDel {
        key: u8,
        value: u8,
    },
    Get {
        key: u8,
    },
    ExpireDue,
}

fn op() -> impl Strategy<Value = OpSpec> {
    let condition = prop_oneof![
        Just(None),
        Just(Some(SetCondition::Nx)),
        Just(Some(SetCondition::Nex))
    ];
    prop_oneof![
        4 => (0..4u8, 0..3u8, condition, proptest::option::of(1..3_000u64), proptest::option::of(0..4u8))
            .prop_map(|(key, value, condition, px_ms, ft)| OpSpec::Set { key, value, condition, px_ms, ft }),
        1 => (0..4u8, proptest::option::of(0..4u8)).prop_map(|(key, ft)| OpSpec::Del { key, ft }),
        1 => (0..4u8, 0..3u8).prop_map(|(key, value)| OpSpec::VDel { key, value }),
        1 => (0..4u8).prop_map(|key| OpSpec::Get { key }),
        1 => Just(OpSpec::ExpireDue),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0..2_000u64, op(), proptest::option::of(0..3u8))
            .prop_map(|(advance_ms, op, dedup)| Step::Write { advance_ms, op, dedup }),
        1 => Just(Step::Restart),
    ]
}

fn entry(now: u64, op: &OpSpec, correlation: Option<u8>) -> Entry {
    let key = |k: &u8| b(&format!("key{k}"));
    let value = |v: &u8| b(&format!("value{v}"));
    let ft = |f: &Option<u8>| f.map(|f| Hlc::new(T0 + u64::from(f) * 1_000, 0, "client"));
    let dedup = correlation.and_then(|c| dedup(now, &format!("corr{c}")));
    match op {
        OpSpec::Set {
            key: k,
            value: v,
            condition,
            px_ms,
            ft: f,
        } => request(
            now,
            Command::Set {
                key: key(k),
                value: value(v),
                condition: condition.clone(),
                px_ms: *px_ms,
            },
            ft(f),
            dedup,
        ),
        OpSpec::Del { key: k, ft: f } => request(now, Command::Del { key: key(k) }, ft(f), dedup),
        OpSpec::VDel { key: k, value: v } => request(
            now,
            Command::VDel {
                key: key(k),
                value: value(v),
            },
            None,
            dedup,
        ),
        OpSpec::Get { key: k } => request(now, Command::Get { key: key(k) }, None, None),
        OpSpec::ExpireDue => Entry {
            now_ms: now,
            op: Op::ExpireDue,
        },
    }
}

async fn run(steps: Vec<Step>) {
    let dir = tempfile::tempdir().unwrap();
    let options = NodeOptions {
        snapshot_every: 4,
        logs_kept_after_snapshot: 2,
        ..NodeOptions::default()
    };
    let mut direct = StateMachine::new(config());
    let (mut node, mut recorder) = open(dir.path(), options.clone()).await;
    let mut now = T0 + 10_000;
    let mut written = 0;
    for step in steps {
        match step {
            Step::Write {
                advance_ms,
                op,
                dedup,
            } => {
                now += advance_ms;
                write_both(&node, &mut direct, entry(now, &op, dedup)).await;
                written += 1;
                assert_eq!(recorder.seen().len(), written);
            }
            Step::Restart => {
                node.shutdown().await.unwrap();
                (node, recorder) = open(dir.path(), options.clone()).await;
                written = 0;
                assert_eq!(snapshot_of(&node), direct);
            }
        }
    }
    assert_eq!(snapshot_of(&node), direct);
    node.shutdown().await.unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn store_node_answers_like_a_fresh_state_machine(steps in proptest::collection::vec(step(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(run(steps));
    }
}
