#!/usr/bin/env python3
"""Scale-out of `make bench`: 1, 2 and 3 processor instances in one group on one broker (Tansu in
scripts/bench.sh), on a backlog of N requests in 12 partitions (limit.c's, PRODUCTION-shaped: the simulated
controller is allowed to answer them), 0 ms simulated controller.

For n instances, n-1 start first; once their outcomes flow, the n-th joins. Reported per n:
  throughput   outcomes per second from the end of the join's pause to the last outcome (all n
               instances working), by the outcome records' timestamps;
  pause_ms     the longest gap between consecutive outcomes after the n-th instance started: what
               its rebalance stopped (0 for one instance);
  cpu_us       the instances' CPU (user + system, /proc) over the requests;
  readers_reopened  how often the outcome reader was replaced after a minute without a record (on
               Tansu one stopped receiving with outcomes left in the topic, and one skipped records
               it later read: each new reader reads the topic from the start, and an outcome is
               counted once by its partition and offset).
Prints one JSON object per n.

usage: scale_bench.py --binary B --limit .build/limit --bootstrap-servers H:P [--count 300000]
       [--partitions 12] [--instances 1,2,3] [--workers 2]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, TopicPartition

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / TICK
    except OSError:
        return 0.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--limit", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--instances", default="1,2,3")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout-s", type=int, default=600)
    args = parser.parse_args()
    bootstrap = args.bootstrap_servers
    for n in [int(x) for x in args.instances.split(",")]:
        prefix = f"bench.scale{n}-{int(time.time())}"
        work = tempfile.mkdtemp(prefix="encore-scale-")
        topics = {"requests": f"{prefix}.requests", "outcomes": f"{prefix}.outcomes",
                  "entitlements": f"{prefix}.changes", "dead-letter": f"{prefix}.dl", "state": f"{prefix}.state"}
        flags = [f"--{name}-topic={topic}" for name, topic in topics.items()]
        subprocess.run([args.binary, "topics", "create", "--bootstrap-servers", bootstrap, "--partitions",
                        str(args.partitions), *flags], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([args.limit, "fill", bootstrap, str(args.count)], check=True, stderr=subprocess.DEVNULL,
                       env={**os.environ, "IN_TOPIC": topics["requests"], "PARTS": str(args.partitions)})
        # Outcomes read, by partition and offset: a reader that replaced a stalled one reads from the
        # start and counts only what its predecessors did not.
        seen = set()

        def open_reader():
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-reader",
                                 "enable.auto.commit": False, "auto.offset.reset": "earliest"})
            consumer.assign([TopicPartition(topics["outcomes"], p, 0) for p in range(args.partitions)])
            return consumer

        reader = open_reader()
        last_read = time.monotonic()
        reopened = 0
        command = [args.binary, "run", "--bootstrap-servers", bootstrap, *flags, "--controller", "simulated",
                   "--simulated-latency-ms", "0", "--simulated-outcomes", "purchased=1", "--allow-simulated-production", "--group-id", prefix,
                   "--workers", str(args.workers), "--log-level", "info"]
        members = []

        def start(index):
            # Each member's log (its assignments, restores and warnings; nothing per request) stays
            # in the work directory: a run that ends short says where to look.
            with open(f"{work}/member-{index}.log", "w") as log:
                members.append(subprocess.Popen(command + ["--instance-id", f"{prefix}-{index}",
                                                           "--state-dir", f"{work}/state-{index}"],
                                                stdout=log, stderr=subprocess.STDOUT))

        stamps = []
        joined_ms = None
        deadline = time.monotonic() + args.timeout_s
        try:
            for index in range(n - 1):
                start(index)
            if n == 1:
                start(0)
            while len(stamps) < args.count and time.monotonic() < deadline:
                for message in reader.consume(num_messages=10_000, timeout=0.5):
                    if not message.error():
                        place = (message.partition(), message.offset())
                        if place not in seen:
                            seen.add(place)
                            stamps.append(message.timestamp()[1])
                            last_read = time.monotonic()
                # On Tansu a reader has stopped receiving with outcomes left in the topic (a fresh
                # one read them all): after a minute without a new record (a join's pause is about
                # 24 s), read the topic again with a new one.
                if time.monotonic() - last_read > 60:
                    reader.close()
                    reader = open_reader()
                    reopened += 1
                    last_read = time.monotonic()
                # The n-th joins once the others' outcomes flow (10% of the backlog answered).
                if n > 1 and joined_ms is None and len(stamps) >= args.count // 10:
                    joined_ms = int(time.time() * 1000)
                    start(n - 1)
            cpu = sum(cpu_seconds(member.pid) for member in members)
        finally:
            for member in members:
                member.terminate()
            for member in members:
                try:
                    member.wait(30)
                except subprocess.TimeoutExpired:
                    member.kill()
            reader.close()
        stamps.sort()
        if len(stamps) < args.count:
            print(json.dumps({"instances": n, "error": f"{len(stamps)} of {args.count} outcomes",
                              "readers_reopened": reopened, "logs": work}), flush=True)
            continue
        # A complete run's stores and logs are not needed (about 40 MB a run).
        shutil.rmtree(work, ignore_errors=True)
        pause, resumed = 0, stamps[0]
        if joined_ms is not None:
            after = [s for s in stamps if s >= joined_ms - 1]
            gaps = [(b - a, b) for a, b in zip(after, after[1:])]
            if gaps:
                pause, resumed = max(gaps)
        window = [s for s in stamps if s >= resumed]
        span = max(1, window[-1] - window[0]) / 1000
        print(json.dumps({"instances": n, "partitions": args.partitions, "count": args.count,
                          "throughput": round(len(window) / span), "pause_ms": pause,
                          "cpu_us": round(cpu / args.count * 1e6, 1), "readers_reopened": reopened}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
