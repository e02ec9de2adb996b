#!/usr/bin/env bash
# Reference-count operations, and Swift object allocations, per request of `bench --no-kafka` (the
# dispatch loop alone, no broker): the process's count over its whole life, the benchmark's own
# encoding of the requests and its feeding included, divided by the requests. It moves far less with
# the machine's load than CPU time, which here varies by 10 to 70% between runs of one binary (only
# the ticks and waits depend on time): for judging a change that removes copies on the hot path. CPU
# per request (`make bench`) stays the measure of speed; the counting slows the loop, so its CPU
# time under it says nothing. Counts what passes through the dynamic linker: not the runtime's calls
# inside itself.
#   scripts/refcounts.sh [BINARY] [COUNT]     (default: .build/release/encore-processor, 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-.build/release/encore-processor}
count=${2:-100000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -Wall -Wextra -shared -fPIC -o "$work/interpose.so" scripts/refcounts/interpose.c -ldl
if ! LD_PRELOAD="$work/interpose.so" "$binary" bench --no-kafka --count "$count" --json >"$work/report.json" \
  2>"$work/err"; then
  cat "$work/err" >&2
  exit 1
fi
python3 - "$work/err" "$work/report.json" "$count" <<'PY'
import json, re, sys
lines = [line for line in open(sys.argv[1]) if line.startswith("REFCOUNTS")]
if not lines:
    sys.exit("refcounts: the interposer printed no counts")
counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])}
report = json.load(open(sys.argv[2]))
n = int(sys.argv[3])
per = {k: v / n for k, v in counts.items()}
print(json.dumps({"requests": n, "processed": report["processed"], **{k: round(v, 1) for k, v in per.items()},
                  "total_per_request": round(sum(v for k, v in per.items() if k != "allocations"), 1)}))
PY
