#!/usr/bin/env bash
# Opens the HTML reports of `loadtest` and `audit` in headless Chromium (scripts/browser_check.py)
# and checks them against the JSON reports of the same runs. Usage: check_reports_in_browser.sh BINARY
# On the loopback only: an embedded broker (`BINARY broker`), a processor, a short steady load test
# (300/s for 6 s in windows of 2.5 s, so the last window is partial), then an audit of the topics.
# SCREENSHOTS=DIR keeps a screenshot of each report there. Exit status 0 when every check passes.
set -euo pipefail
binary=$(realpath "${1:?usage: $0 BINARY}")
checker="$(cd "$(dirname "$0")" && pwd)/browser_check.py"
work=$(mktemp -d)
pids=()
# The processor first, while its broker still answers; whatever has not stopped in 15 s is killed.
cleanup() {
  local pid deadline
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid=${pids[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "check_reports_in_browser: $*" >&2; for log in "$work"/*.log; do tail -n 20 "$log" >&2; done; exit 1; }

"$binary" broker --partitions 4 --log-level warning >"$work/broker.out" 2>"$work/broker.log" &
pids+=($!)
deadline=$((SECONDS + 30))
until servers=$(sed -n 's/^bootstrap\.servers=//p' "$work/broker.out" 2>/dev/null) && [ -n "$servers" ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the broker printed no bootstrap.servers in 30 s"
  sleep 0.1
done
case "$servers" in 127.0.0.1:* | localhost:*) ;; *) fail "the broker is not on the loopback: $servers" ;; esac

"$binary" run --bootstrap-servers "$servers" --group-id browser-check --controller simulated \
  --simulated-latency-ms 5 --state-dir none -X fetch.wait.max.ms=10 --log-level warning >"$work/run.log" 2>&1 &
pids+=($!)

loadtest() { "$binary" loadtest --bootstrap-servers "$servers" --users 200 --log-level warning "$@"; }
# Until a small run is answered: the processor has joined its group and outcomes flow.
deadline=$((SECONDS + 90))
until loadtest --rate 20 --duration 1 --grace 10 --run-id warmup >"$work/warmup.out" 2>>"$work/warmup.log"; do
  [ "$SECONDS" -lt "$deadline" ] || fail "no warm-up load test passed in 90 s"
  sleep 1  # (a run that fails at once is not retried in a tight loop)
done

loadtest --rate 300 --duration 6 --window-s 2.5 --grace 30 --invalid-ratio 0.02 --run-id browser \
  --json --html "$work/loadtest.html" >"$work/loadtest.json" 2>"$work/loadtest.log" \
  || fail "the load test failed: $(cat "$work/loadtest.json")"
"$binary" audit --bootstrap-servers "$servers" --timeout-ms 60000 --log-level warning \
  --json --html "$work/audit.html" >"$work/audit.json" 2>"$work/audit.log" \
  || fail "the audit found discrepancies or failed: $(head -c 2000 "$work/audit.json")"

status=0
for kind in loadtest audit; do
  python3 "$checker" "$kind" "$work/$kind.html" "$work/$kind.json" \
    ${SCREENSHOTS:+--screenshot "$SCREENSHOTS/$kind.png"} || status=1
done
exit "$status"
