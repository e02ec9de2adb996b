#!/usr/bin/env bash
# Validates deploy/k8s without a cluster: renders the kustomization (scripts/render_kustomize.py;
# compared with `kubectl kustomize` where kubectl exists), validates every object against the
# Kubernetes schemas (kubernetes-validate --strict), and checks the processor's arguments, config
# file and secrets with BINARY (scripts/check_k8s_manifests.py).
# Usage: scripts/check_k8s.sh BINARY
set -euo pipefail
binary=$(realpath "${1:?usage: scripts/check_k8s.sh BINARY}")
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 scripts/render_kustomize.py deploy/k8s -o "$work/rendered.yaml"
if command -v kubectl >/dev/null 2>&1; then
  kubectl kustomize deploy/k8s >"$work/kubectl.yaml"
  python3 scripts/check_k8s_manifests.py --same "$work/rendered.yaml" "$work/kubectl.yaml"
else
  echo "note: no kubectl here: the rendering is not compared with kubectl kustomize's"
fi

# The oldest Kubernetes still commonly run, and the newest the installed schemas know.
newest=$(python3 -c 'import kubernetes_validate.utils as u; print(u.latest_version())')
python3 -m kubernetes_validate --strict --quiet -k 1.30.0 -k "$newest" "$work/rendered.yaml"
echo "ok: every object valid (strict) for Kubernetes 1.30.0 and $newest"

python3 scripts/check_k8s_manifests.py "$binary" "$work/rendered.yaml"
