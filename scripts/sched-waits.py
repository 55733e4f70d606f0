#!/usr/bin/env python3
"""Per-thread scheduling figures from a scheduler trace.

Reads `perf script -F comm,tid,cpu,time,event,trace` output of `sched:sched_wakeup` and
`sched:sched_switch` events on standard input and prints, for each thread name (trailing
numbers folded, so `mqkv-conn-0` and `mqkv-conn-1` are one row), per second of trace:
  - wake-ups, and how long a woken thread waited before it ran (runnable but not running:
    mean, median, 90th percentile, total);
  - time on a CPU;
  - switches away, by the state the thread left in: S (sleeping), D (waiting for the disk),
    R (preempted while runnable).
Then the most frequent pairs, per second, in two tables: who woke whom (the waker is the thread
on the CPU when the wake-up happened, which for a wake-up from an interrupt, such as a disk
completion, is whichever thread the interrupt landed on), and which thread handed its CPU to
which, leaving in what state.
"""

import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)")
WAKEUP = re.compile(r"comm=(.+?) pid=(\d+)")
SWITCH = re.compile(
    r"prev_comm=(.+?) prev_pid=(\d+) .*prev_state=(\S+) ==> next_comm=(.+?) next_pid=(\d+)"
)


def fold(name):
    return re.sub(r"[-/:]?\d+(-\S+)?$", "", name)


def main():
    woken = {}  # tid -> time of its wake-up
    running = {}  # tid -> time it was switched in
    names = {}
    waits = defaultdict(list)
    on_cpu = defaultdict(float)
    switches = defaultdict(lambda: defaultdict(int))
    wakers = defaultdict(int)  # (waker, woken) -> count
    handovers = defaultdict(int)  # (prev, state, next) -> count
    first = last = None
    for line in sys.stdin:
        m = LINE.match(line)
        if not m:
            continue
        comm, _, _, t, event, trace = m.groups()
        t = float(t)
        first = t if first is None else first
        last = t
        if event == "sched:sched_wakeup":
            w = WAKEUP.search(trace)
            if w:
                names[w.group(2)] = w.group(1)
                woken[w.group(2)] = t
                wakers[(fold(comm), fold(w.group(1)))] += 1
        elif event == "sched:sched_switch":
            s = SWITCH.search(trace)
            if not s:
                continue
            prev_comm, prev, state, next_comm, nxt = s.groups()
            names[prev], names[nxt] = prev_comm, next_comm
            if prev in running:
                on_cpu[fold(prev_comm)] += t - running.pop(prev)
            switches[fold(prev_comm)][state.rstrip("+")[:1]] += 1
            handovers[(fold(prev_comm), state.rstrip("+")[:1], fold(next_comm))] += 1
            if nxt in woken:
                waits[fold(next_comm)].append(t - woken.pop(nxt))
            running[nxt] = t
    if first is None or last <= first:
        sys.exit("no scheduler events in the trace")
    span = last - first
    rows = sorted(
        set(waits) | set(on_cpu),
        key=lambda n: -(on_cpu.get(n, 0.0) + sum(waits.get(n, []))),
    )
    print(f"trace of {span:.2f} s; per second:")
    print(
        f"{'thread':<20} {'wake-ups':>9} {'wait mean':>10} {'p50':>7} {'p90':>7} "
        f"{'waited':>9} {'on cpu':>9} {'S':>7} {'D':>7} {'R':>7}"
    )
    for name in rows:
        if name in ("swapper", "perf"):
            continue
        w = sorted(waits.get(name, []))
        mean = statistics.mean(w) * 1e6 if w else 0.0
        p50 = w[len(w) // 2] * 1e6 if w else 0.0
        p90 = w[int(len(w) * 0.9)] * 1e6 if w else 0.0
        sw = switches.get(name, {})
        print(
            f"{name[:20]:<20} {len(w) / span:>9.0f} {mean:>8.1f}us {p50:>5.1f}us "
            f"{p90:>5.1f}us {sum(w) / span * 1e3:>7.1f}ms {on_cpu.get(name, 0.0) / span * 1e3:>7.1f}ms "
            f"{sw.get('S', 0) / span:>7.0f} {sw.get('D', 0) / span:>7.0f} {sw.get('R', 0) / span:>7.0f}"
        )
    print_pairs(
        "wake-ups a second, by waker and woken thread:",
        ("waker", "woken"),
        wakers,
        span,
    )
    print_pairs(
        "switches a second, by the thread leaving the CPU, its state and the thread taking it:",
        ("leaving", "state", "taking"),
        handovers,
        span,
    )


def print_pairs(title, columns, counts, span, rows=16):
    """The most frequent `rows` keys of `counts`, per second of `span`, with their total."""
    total = sum(counts.values())
    print()
    print(f"{title} {total / span:.0f} in all")
    print(" ".join(f"{c:<20}" for c in columns) + f" {'per s':>8}")
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1])[:rows]:
        print(" ".join(f"{k[:20]:<20}" for k in key) + f" {n / span:>8.0f}")


if __name__ == "__main__":
    main()
