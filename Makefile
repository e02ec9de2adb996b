# The two commands of the README: `make demo` and `make test`. Both install what they need first.
.PHONY: deps build demo test lint deploy-check browser-check bench bench-ledger bench-audit

# Where pip puts console scripts (pyenv shims may not be rehashed on a fresh machine).
PYBIN := $(shell python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')

deps:
	@scripts/install-deps.sh

build: deps
	swift build -c release --product encore-processor

demo: build
	.build/release/encore-processor demo

test: deps
	swift build --build-tests
	swift test

lint:
	swift format lint --strict -r Sources Tests

# Headless Chromium opens the status page of a running processor and the loadtest and audit HTML
# reports: no console errors, charts drawn, every number shown equal to the JSON beside it.
browser-check: deps
	swift build --product encore-processor
	scripts/check_reports_in_browser.sh .build/debug/encore-processor
	python3 scripts/check_status_page.py .build/debug/encore-processor

# limit.c and the processor side by side on the mock cluster and on Tansu (several minutes).
bench: deps
	scripts/bench.sh

# Restore time and memory of the entitlement ledger for 100,000 users: from the changelog, through a
# fresh state store, and on a restart with the store (about two minutes).
bench-ledger: build
	python3 scripts/ledger_restore_bench.py --users 100000 --partitions 16 --state-dir /tmp/encore-bench-ledger-state

# Time and memory of `audit` on a million processed requests on Tansu (several minutes).
bench-audit: deps
	scripts/audit_bench.sh

# Deployment files cannot run here (no Docker engine): validate them instead (compose, Dockerfile,
# Kubernetes manifests, alert rules with their unit tests, the dashboard against a real Prometheus).
deploy-check: deps
	swift build --product encore-processor
	python3 -m check_jsonschema --builtin-schema vendor.compose-spec docker-compose.yml
	$(PYBIN)/hadolint Dockerfile
	python3 scripts/check_compose_commands.py .build/debug/encore-processor docker-compose.yml
	scripts/check_k8s.sh .build/debug/encore-processor
	scripts/check_monitoring.sh .build/debug/encore-processor
	python3 scripts/check_allocator.py .build/debug/encore-processor
