#!/usr/bin/env bash
# Flame graph of one server process while a benchmark drives it.
#
#   bash scripts/flamegraph.sh [options] [-- mqkv-bench arguments]
#
# Options:
#   --out FILE.svg   where the flame graph goes (default bench-results/flamegraph.svg; the
#                    folded stacks are written beside it as FILE.folded, and where each
#                    thread's samples go (scripts/folded-summary.py) as FILE.summary.txt)
#   --match REGEX    the process to profile, as `pgrep -f` matches its command line
#                    (default: the durable mqkv server, 'mqkv serve.*--storage disk')
#   --nth N          profile the N-th distinct process that matches (default 1); Redis renames
#                    itself to `redis-server HOST:PORT`, so `--match redis-server --nth 2` is
#                    the second Redis the run starts (with `set`: the one with `appendfsync always`)
#   --seconds S      how long to record (default 2), after 1.5 s of the process's warm-up
#   --freq HZ        sampling frequency (default 1999)
#   --sched          instead of a flame graph, trace the scheduler on every CPU for the same
#                    window and print, per thread name, wake-ups, how long woken threads waited
#                    for a CPU, time on a CPU and switches by state (scripts/sched-waits.py);
#                    the table is also written to the --out path with .txt for .svg
#
# The benchmark arguments default to durable SET, 16 B values, 64 clients, 6 s. Needs `perf`
# (Debian: linux-perf) and inferno (`cargo install inferno`, installed here when missing).
# Example, Redis `appendfsync always` under the same load:
#   bash scripts/flamegraph.sh --match redis-server --nth 2 --out redis-aof.svg -- \
#       --workloads set --clients 64 --disk-clients 64 --value-sizes 16 --duration 6
set -euo pipefail
cd "$(dirname "$0")/.."

out=bench-results/flamegraph.svg
match='mqkv serve.*--storage disk'
nth=1
seconds=2
freq=1999
sched=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --match) match=$2; shift 2 ;;
    --nth) nth=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --freq) freq=$2; shift 2 ;;
    --sched) sched=1; shift ;;
    --) shift; break ;;
    *) echo "unknown option $1 (benchmark arguments go after --)" >&2; exit 2 ;;
  esac
done
bench_args=("$@")
if [ ${#bench_args[@]} -eq 0 ]; then
  bench_args=(--workloads set --clients 1 --disk-clients 64 --value-sizes 16 --duration 6 --no-anchors)
fi

command -v perf >/dev/null 2>&1 || { echo "perf is not installed (Debian: apt-get install linux-perf)" >&2; exit 1; }
if [ $sched -eq 0 ] && ! command -v inferno-flamegraph >/dev/null 2>&1; then
  cargo install inferno --locked
fi
cargo build --release -p mqkv -p mqkv-bench

mkdir -p "$(dirname "$out")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

target/release/mqkv-bench --out "$work/bench" "${bench_args[@]}" >"$work/bench.log" 2>&1 &
bench=$!

# Wait for the N-th distinct process that matches (the benchmark starts a fresh server for
# every configuration).
seen=()
pid=""
for _ in $(seq 1 3000); do
  for p in $(pgrep -f -- "$match" || true); do
    # Only the benchmark's own children: the command lines of this script, its subshells and
    # whatever runs it (`timeout`, `nohup`) hold the pattern too.
    [ "$(ps -o ppid= -p "$p" 2>/dev/null | tr -d ' ')" = "$bench" ] || continue
    new=1
    for s in "${seen[@]}"; do [ "$s" = "$p" ] && new=0; done
    [ $new -eq 1 ] && seen+=("$p")
  done
  if [ ${#seen[@]} -ge "$nth" ]; then pid=${seen[$((nth - 1))]}; break; fi
  kill -0 "$bench" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$pid" ]; then
  wait "$bench" || true
  echo "no process matched '$match' (${#seen[@]} seen); the benchmark printed:" >&2
  cat "$work/bench.log" >&2
  exit 1
fi

sleep 1.5
if [ $sched -eq 1 ]; then
  echo "tracing the scheduler while $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-100) (pid $pid) runs, ${seconds}s"
  perf record -q -a -e sched:sched_wakeup -e sched:sched_switch -o "$work/sched.data" -- sleep "$seconds" >/dev/null 2>&1
  wait "$bench"
  grep '^|' "$work/bench.log" || true
  perf script -i "$work/sched.data" -F comm,tid,cpu,time,event,trace 2>/dev/null |
    python3 scripts/sched-waits.py | tee "${out%.svg}.txt"
  exit 0
fi
echo "recording $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null | cut -c1-100) (pid $pid) for ${seconds}s"
perf record -q -F "$freq" --call-graph dwarf,16384 -o "$work/perf.data" -p "$pid" -- sleep "$seconds" >/dev/null 2>&1
wait "$bench"
grep '^|' "$work/bench.log" || true

perf script -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf --all >"${out%.svg}.folded"
# Frames narrower than a pixel are left out: the graph stays a few hundred kilobytes.
inferno-flamegraph --minwidth 1 --title "$(basename "${out%.svg}")" <"${out%.svg}.folded" >"$out"
echo "wrote $out and ${out%.svg}.folded ($(wc -l <"${out%.svg}.folded") distinct stacks)"
python3 scripts/folded-summary.py "${out%.svg}.folded" | tee "${out%.svg}.summary.txt"
