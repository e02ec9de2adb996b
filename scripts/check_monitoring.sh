#!/usr/bin/env bash
# Checks the monitoring files: the alert rules (promtool check, and their unit tests), the
# Prometheus config, the Grafana dashboard and its provisioning, and then a real Prometheus
# scraping a running processor (embedded broker, generated traffic, loopback only) knows every
# metric name the dashboard and the rules use, and evaluates the rules without error.
# Usage: scripts/check_monitoring.sh BINARY   (exits non-zero on any failure; about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
binary=$(realpath "${1:?usage: scripts/check_monitoring.sh BINARY}")
rules=deploy/prometheus/alerts.yml
dashboards=(deploy/grafana/dashboards/*.json)
helper="python3 scripts/monitoring_metrics.py"

tmp=$(mktemp -d)
pids=()
cleanup() {
  # SIGTERM, then SIGKILL whatever has not stopped within 10 s (the processor drains first).
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap "exit 130" INT TERM

echo "== rules, config, rule unit tests"
promtool check rules "$rules"
promtool check config deploy/prometheus/prometheus.yml
promtool test rules deploy/prometheus/alerts_test.yml
$helper check-tests "$rules" deploy/prometheus/alerts_test.yml

echo "== dashboard"
$helper check-dashboard --datasources deploy/grafana/provisioning/datasources/prometheus.yml \
  --compose docker-compose.yml "${dashboards[@]}"
$helper dashboard-rules "${dashboards[@]}" > "$tmp/dashboard-rules.yml"
promtool check rules "$tmp/dashboard-rules.yml"  # the panels' PromQL parses

echo "== a real Prometheus scraping the processor"
# The processor takes a port the system chooses (its log names it); Prometheus needs one named.
read -r prometheus_port < <(python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Controller errors and dead letters need traffic that makes them: mixed environments (the
# simulated store refuses PRODUCTION), invalid records, and some error answers. The log exists
# before the processor starts: the loop below may read it before the background shell opens it.
: > "$tmp/processor.log"
"$binary" run --embedded-broker --controller simulated --http-listen "127.0.0.1:0" \
  --state-dir "$tmp/state" --group-id check-monitoring --instance-id check-monitoring \
  --simulated-outcomes purchased=0.8,cancelled=0.1,pending=0.04,retryable-error=0.03,error=0.03 \
  > "$tmp/processor.log" 2>&1 &
pids+=($!)

deadline=$((SECONDS + 60))
metrics_port=
until [ -n "$metrics_port" ] && curl -fsS "http://127.0.0.1:$metrics_port/readyz" > /dev/null 2>&1; do
  metrics_port=$(sed -n 's/.*operations endpoint listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' \
    "$tmp/processor.log" | head -1)
  if ! kill -0 "${pids[0]}" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
    echo "FAIL the processor was not ready within 60 s:"; tail -20 "$tmp/processor.log"; exit 1
  fi
  sleep 0.2
done
brokers=$(sed -n 's/.*embedded broker listening on \([0-9.:]*\).*/\1/p' "$tmp/processor.log" | head -1)
[ -n "$brokers" ] || { echo "FAIL no embedded broker address in the processor's log"; exit 1; }

cat > "$tmp/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $PWD/$rules
scrape_configs:
  - job_name: encore-processor
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
EOF
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn > "$tmp/prometheus.log" 2>&1 &
pids+=($!)
url="http://127.0.0.1:$prometheus_port"
$helper wait-scraped "$url" encore-processor 60 || { tail -20 "$tmp/prometheus.log"; exit 1; }

"$binary" generate --bootstrap-servers "$brokers" --count 2000 --invalid-ratio 0.05 --duplicate-ratio 0.02 \
  --environment mixed --log-level warning > "$tmp/generate.log" 2>&1 \
  || { echo "FAIL generate:"; cat "$tmp/generate.log"; exit 1; }
$helper wait-names "$url" 90 "$rules" "${dashboards[@]}" \
  || { grep -v 'dead letter' "$tmp/processor.log" | tail -10; exit 1; }
echo "monitoring checks passed"
