#!/usr/bin/env bash
# Reference-count operations per request of the dispatch loop alone (`bench --no-kafka`): a
# figure that does not move with the machine's load, where CPU time here varies by 10 to 30%
# between runs of one binary. For judging a change that removes copies on the hot path; CPU per
# request (`make bench`) stays the measure of speed. Counts only what passes through the dynamic
# linker (the process's own code), not the runtime's calls inside itself. (The counting slows
# the loop: its CPU time under it says nothing.)
#   scripts/refcounts.sh [BINARY] [COUNT]     (default: .build/release/encore-processor, 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${1:-.build/release/encore-processor}
count=${2:-100000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -shared -fPIC -o "$work/interpose.so" scripts/refcounts/interpose.c -ldl
LD_PRELOAD="$work/interpose.so" "$binary" bench --no-kafka --count "$count" --json >"$work/report.json" 2>"$work/err"
python3 - "$work/err" "$work/report.json" "$count" <<'PY'
import json, re, sys
counts = {k: int(v) for k, v in re.findall(r'(\w+)=(\d+)', next(l for l in open(sys.argv[1]) if l.startswith('REFCOUNTS')))}
report = json.load(open(sys.argv[2]))
n = int(sys.argv[3])
assert report['processed'] == n, f"the loop processed {report['processed']} of {n} requests"
per = {k: v / n for k, v in counts.items()}
print(json.dumps({'requests': n, **{k: round(v, 1) for k, v in per.items()},
                  'total_per_request': round(sum(per.values()), 1)}))
PY
