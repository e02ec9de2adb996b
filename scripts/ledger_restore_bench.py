#!/usr/bin/env python3
"""Restore time and memory of the entitlement ledger: fills the changelog with USERS users' state
(one trial grant, one RevenueCat state and one access answer each, as the processor writes them),
starts `encore-processor run` on it and reports how long the restore took (from the processor's
own log line) and its resident memory after the restore, against the same run on an empty
changelog. Runs on the embedded broker in its own process (`encore-processor broker`).

  scripts/ledger_restore_bench.py [--users 100000] [--partitions 8] [--binary .build/release/encore-processor]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zlib

from confluent_kafka import Producer


def start_broker(binary, partitions):
    broker = subprocess.Popen([binary, "broker", "--partitions", str(partitions)], stdout=subprocess.PIPE, text=True)
    line = broker.stdout.readline().strip()
    if not line.startswith("bootstrap.servers="):
        sys.exit(f"broker did not start: {line!r}")
    return broker, line.split("=", 1)[1]


def fill(bootstrap, users, partitions):
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1000000})
    now = int(time.time() * 1000)
    for n in range(users):
        user = f"user-{n:07d}"
        state = {
            "app_id": "app_bench", "app_user_id": user, "sequence": 3, "updated_at_ms": now,
            "grants": [{
                "product_id": "com.app.trial_7d", "entitlement": {"type": "freeTrial", "value": 7, "unit": "days"},
                "status": "verified", "is_active": True, "granted_at_ms": now,
                "expires_at_ms": now + 7 * 86_400_000, "request_id": f"req-{n}", "campaign_id": "cmp-spring",
            }],
            "sources": [{
                "source": "revenuecat", "entitlement_id": "pro", "is_active": False, "event_id": f"rc-{n}",
                "occurred_at_ms": now,
            }],
            "access": [{"rule": "pro", "is_active": True}],
        }
        key = f"app_bench:{user}"
        while True:
            try:
                producer.produce("encore.entitlement-state", key=key, value=json.dumps(state),
                                 partition=zlib.crc32(key.encode()) % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush()


def restore(binary, bootstrap, group=None, state_dir="none"):
    """Runs the processor until its restore log line; returns (seconds, users, RSS MiB, seconds
    from the start to the restore's end, the group join included)."""
    started = time.time()
    process = subprocess.Popen(
        [binary, "run", "--bootstrap-servers", bootstrap, "--controller", "simulated", "--log-level", "info",
         "--group-id", group or f"restore-{time.time()}", "--state-dir", state_dir,
         "--access-rule", "pro = revenuecat:pro | encore:freeTrial"],
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 600
        for line in process.stderr:
            match = re.search(r"restored the ledger state of (\d+) users .* in ([0-9.e-]+) seconds", line)
            if match:
                time.sleep(1)  # let the first ticks run (expiry scan)
                with open(f"/proc/{process.pid}/status") as status:
                    rss = int(re.search(r"VmRSS:\s+(\d+)", status.read()).group(1)) / 1024
                return float(match.group(2)), int(match.group(1)), rss, time.time() - started
            if time.time() > deadline:
                break
        sys.exit("the processor did not report a restore")
    finally:
        process.terminate()
        process.wait(timeout=60)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--binary", default=".build/release/encore-processor")
    parser.add_argument("--state-dir", help="also restore through a state store in a new directory inside this "
                        "one (removed after): built fresh from the changelog, then a restart on it")
    args = parser.parse_args()
    results = {}
    for label, users in [("empty", 0), ("filled", args.users)]:
        broker, bootstrap = start_broker(args.binary, args.partitions)
        try:
            if users:
                started = time.time()
                fill(bootstrap, users, args.partitions)
                print(f"filled the changelog with {users} users in {time.time() - started:.1f} s", file=sys.stderr)
            results[label] = restore(args.binary, bootstrap)
            if users and args.state_dir:
                # A store of its own inside the directory given (never the directory itself).
                store = os.path.join(args.state_dir, f"ledger-bench-{os.getpid()}")
                group = f"restore-store-{time.time()}"
                try:
                    results["fresh store"] = restore(args.binary, bootstrap, group, store)
                    results["restart on the store"] = restore(args.binary, bootstrap, group, store)
                finally:
                    shutil.rmtree(store, ignore_errors=True)
        finally:
            broker.terminate()
            broker.wait(timeout=30)
    _, _, base, _ = results["empty"]
    for label in ["filled", "fresh store", "restart on the store"]:
        if label not in results:
            continue
        seconds, restored, rss, wall = results[label]
        per = (rss - base) / max(restored, 1) * 100_000
        what = {"filled": "from the changelog (no store)", "fresh store": "through a fresh state store (rebuilt from "
                "the changelog)", "restart on the store": "on a restart with the store at its checkpoint"}[label]
        print(f"{what}: restored {restored} users in {seconds:.2f} s ({restored / max(seconds, 1e-9):,.0f} users/s), "
              f"{wall:.1f} s from start (group join included); RSS {rss:.0f} MiB vs {base:.0f} MiB with an empty "
              f"changelog: {per:.0f} MiB per 100,000 users")
    return 0 if results["filled"][1] == args.users else 1


if __name__ == "__main__":
    sys.exit(main())
