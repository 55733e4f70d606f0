#!/usr/bin/env python3
"""Where a profile's samples go, by thread and by what the thread was doing.

Reads the folded stacks that `scripts/flamegraph.sh` writes beside its flame graph (one stack
per line, the thread name first, frames separated by `;`, kernel frames ending in `_[k]`, the
sample weight last) and prints, for each thread name (trailing numbers folded, so
`mqkv-conn-0` and `mqkv-conn-1` are one row), its share of all samples and how its own samples
split between:
  - each system call (named by the first `__x64_sys_*`, `ksys_*` or `__sys_*` frame);
  - being switched out or in outside a system call (preempted on the way back to user space,
    or an interrupt's return): `schedule (preempted)`;
  - other kernel work (interrupts, page faults);
  - user space.
Inside a system call, the share spent switching threads (`__schedule`, where a thread that
sleeps or is woken pays for the switch) is printed beneath it.

    python3 scripts/folded-summary.py bench-results/flamegraph.folded
"""

import re
import sys
from collections import Counter, defaultdict

# The system call entry frame; some calls reach their `ksys_*` or `__sys_*` body with no
# `__x64_sys_*` frame of their own (Redis's `write` and `read`).
SYSCALL = re.compile(r"^(?:__(?:x64|ia32)_sys_|ksys_|__sys_)(\w+)_\[k\]$")


def fold(name):
    return re.sub(r"[-/:]?\d+$", "", name)


def classify(frames):
    """The category of one stack (frames from the outermost), and whether it is switching."""
    switching = "__schedule_[k]" in frames
    for frame in frames:
        m = SYSCALL.match(frame)
        if m:
            return "syscall " + m.group(1), switching
    if switching:
        return "schedule (preempted)", True
    if any(f.endswith("_[k]") for f in frames):
        return "other kernel", False
    return "user space", False


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: folded-summary.py FILE.folded")
    threads = Counter()
    parts = defaultdict(Counter)
    switching = defaultdict(Counter)
    total = 0
    with open(sys.argv[1], encoding="utf-8", errors="replace") as folded:
        for line in folded:
            stack, _, weight = line.rstrip("\n").rpartition(" ")
            if not stack or not weight.isdigit():
                continue
            n = int(weight)
            frames = stack.split(";")
            thread = fold(frames[0])
            category, in_switch = classify(frames[1:])
            total += n
            threads[thread] += n
            parts[thread][category] += n
            if in_switch:
                switching[thread][category] += n
    if total == 0:
        sys.exit("no samples")
    for thread, n in threads.most_common():
        print(f"{thread:24} {100 * n / total:5.1f} % of all samples")
        for category, m in parts[thread].most_common():
            if 100 * m / n < 0.5:
                break
            print(f"    {category:30} {100 * m / n:5.1f} %")
            s = switching[thread][category]
            if s and category.startswith("syscall") and 100 * s / n >= 0.5:
                print(f"        {'of it switching threads':26} {100 * s / n:5.1f} %")


if __name__ == "__main__":
    main()
