//! A linearizability checker for the history of one key (a register with SET, GET, DEL and
//! VDEL), after Wing and Gong's search with Lowe's memoization: look for an order of the
//! operations that respects real time (an operation that returned before another was called
//! comes first) and in which every answer is what a single copy of the key would have given.
//!
//! An operation whose outcome is unknown (no answer, or an answer saying the store could not
//! tell) is *pending*: it may take effect at any moment after it was called, or never. Reads
//! with an unknown outcome say nothing and are left out of histories.

use std::collections::HashSet;

/// What was asked, and what was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// SET, acknowledged or pending.
    Set(String),
    /// GET, answered with the value found.
    Get(Option<String>),
    /// DEL, answered with how many keys it deleted (`None`: pending).
    Del(Option<i64>),
    /// VDEL of a value, answered 1 (deleted), 0 (absent) or -1 (another value; `None`: pending).
    VDel(String, Option<i64>),
}

#[derive(Debug, Clone)]
pub struct Op {
    /// When it was sent, in any unit that only grows.
    pub call: u64,
    /// When its answer came back; `None` for a pending operation.
    pub ret: Option<u64>,
    pub kind: Kind,
}

type State = Option<String>;

/// The state after `kind` if it is consistent with `state`, else `None`.
fn step(state: &State, kind: &Kind) -> Option<State> {
    match kind {
        Kind::Set(v) => Some(Some(v.clone())),
        Kind::Get(seen) => (seen == state).then(|| state.clone()),
        Kind::Del(answer) => {
            let deleted = i64::from(state.is_some());
            answer.is_none_or(|a| a == deleted).then_some(None)
        }
        Kind::VDel(v, answer) => {
            let (result, next) = match state {
                Some(current) if current == v => (1, None),
                Some(_) => (-1, state.clone()),
                None => (0, None),
            };
            answer.is_none_or(|a| a == result).then_some(next)
        }
    }
}

/// True if `history` is linearizable for a key that starts absent.
pub fn linearizable(history: &[Op]) -> bool {
    let mut ops: Vec<&Op> = history.iter().collect();
    ops.sort_by_key(|o| o.call);
    let n = ops.len();
    let words = n.div_ceil(64).max(1);
    let mut done = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    search(&ops, &mut done, &None, &mut seen)
}

fn is_done(done: &[u64], i: usize) -> bool {
    done[i / 64] & (1 << (i % 64)) != 0
}

fn flip(done: &mut [u64], i: usize) {
    done[i / 64] ^= 1 << (i % 64);
}

fn search(
    ops: &[&Op],
    done: &mut Vec<u64>,
    state: &State,
    seen: &mut HashSet<(Vec<u64>, State)>,
) -> bool {
    // Every answered operation placed: pending ones left over never took effect.
    let earliest_return = ops
        .iter()
        .enumerate()
        .filter(|(i, o)| !is_done(done, *i) && o.ret.is_some())
        .filter_map(|(_, o)| o.ret)
        .min();
    let Some(earliest_return) = earliest_return else {
        return true;
    };
    if !seen.insert((done.clone(), state.clone())) {
        return false;
    }
    // Candidates for the next place: called before every remaining operation returned.
    for i in 0..ops.len() {
        if is_done(done, i) || ops[i].call > earliest_return {
            continue;
        }
        if let Some(next) = step(state, &ops[i].kind) {
            flip(done, i);
            let found = search(ops, done, &next, seen);
            flip(done, i);
            if found {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(call: u64, ret: u64, kind: Kind) -> Op {
        Op {
            call,
            ret: Some(ret),
            kind,
        }
    }

    fn set(v: &str) -> Kind {
        Kind::Set(v.into())
    }

    fn get(v: Option<&str>) -> Kind {
        Kind::Get(v.map(String::from))
    }

    #[test]
    fn a_sequential_history_is_linearizable() {
        let h = [
            op(0, 1, get(None)),
            op(2, 3, set("a")),
            op(4, 5, get(Some("a"))),
            op(6, 7, Kind::VDel("b".into(), Some(-1))),
            op(8, 9, Kind::VDel("a".into(), Some(1))),
            op(10, 11, Kind::Del(Some(0))),
            op(12, 13, get(None)),
        ];
        assert!(linearizable(&h));
    }

    #[test]
    fn a_stale_read_is_not() {
        let h = [
            op(0, 1, set("a")),
            op(2, 3, set("b")),
            op(4, 5, get(Some("a"))),
        ];
        assert!(!linearizable(&h));
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_see_either_side() {
        for seen in [Some("a"), Some("b")] {
            let h = [op(0, 1, set("a")), op(2, 6, set("b")), op(3, 4, get(seen))];
            assert!(linearizable(&h), "{seen:?}");
        }
        let h = [op(0, 1, set("a")), op(2, 6, set("b")), op(3, 4, get(None))];
        assert!(!linearizable(&h), "the key existed throughout");
    }

    #[test]
    fn a_value_never_written_is_not_read() {
        assert!(!linearizable(&[
            op(0, 1, set("a")),
            op(2, 3, get(Some("z")))
        ]));
    }

    #[test]
    fn a_pending_write_may_take_effect_late_or_never() {
        let pending = Op {
            call: 0,
            ret: None,
            kind: set("p"),
        };
        let late = [
            pending.clone(),
            op(5, 6, get(None)),
            op(7, 8, get(Some("p"))),
        ];
        assert!(linearizable(&late));
        let never = [pending.clone(), op(5, 6, get(None))];
        assert!(linearizable(&never));
        // Once seen, it cannot be unseen.
        let flicker = [pending, op(5, 6, get(Some("p"))), op(7, 8, get(None))];
        assert!(!linearizable(&flicker));
    }

    #[test]
    fn reads_that_disagree_on_order_are_not() {
        // Two writes concurrent with each other; one reader sees a then b, another b then a.
        let h = [
            op(0, 10, set("a")),
            op(0, 10, set("b")),
            op(11, 12, get(Some("a"))),
            op(13, 14, get(Some("b"))),
            op(15, 16, get(Some("a"))),
        ];
        assert!(!linearizable(&h));
    }

    #[test]
    fn wrong_delete_answers_are_caught() {
        assert!(!linearizable(&[
            op(0, 1, set("a")),
            op(2, 3, Kind::Del(Some(0)))
        ]));
        assert!(!linearizable(&[op(0, 1, Kind::VDel("a".into(), Some(1)))]));
        assert!(!linearizable(&[
            op(0, 1, set("a")),
            op(2, 3, Kind::VDel("a".into(), Some(-1)))
        ]));
    }
}
