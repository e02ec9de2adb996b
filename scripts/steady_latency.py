#!/usr/bin/env python3
"""Request→outcome latency under a steady load, the same way for the processor and the Python peer.

Runs the subject under the steady load `bench --rate` offers the processor: the same generator
(`encore-processor generate`, 10,000 users, out of the subject's process), the same rate, on the same
kind of broker. The subject is either the Python peer (../shared/bench/peer_python.py: what the broker
and a client loop add, without the processor) or the processor itself (`encore-processor run`, the
simulated controller at 0 ms, the ledger and journal on, no state store, as `bench` runs it). A reader
takes the subject's outcomes as they arrive and measures, per request, from its `requested_at_ms`
(set when the generator produced it):

  - visible_ms: to the outcome reaching this reader (exactly-once, a read_committed reader: to its
    transaction's commit). For both subjects the same point, past the outcome's acknowledgement by
    the reader's fetch;
  - consumed_ms: to the subject deciding it (the outcome's `completed_at_ms`).

`machine_idle_pct` is the whole machine's idle CPU share over the load (every process's: the
subject's, the broker's, the generator's and the reader's), from /proc/stat: near 0, the cores were
saturated, and the tail includes waits for a core (the broker's too).

The subject's CPU over the load (its process's, from the first generated request to the last outcome
read; the generator's and the reader's are not in it), per request, is `cpu_us_per_request`.

The subject and the reader wait at most 10 ms per fetch, as `bench` configures the processor (the
mock cluster and Tansu hold a fetch for its whole wait instead of answering when data arrives); the
peer polls one record at a time (BATCH=1) and the reader takes what has arrived every 5 ms, so neither
waits to fill a batch.

The first request is a warm-up (the group join is not latency), then 2 s pass, as in `bench --rate`.
Prints one JSON object with p50/p90/p99/max of both; exits 1 if outcomes are missing.

usage: steady_latency.py --binary .build/release/encore-processor --bootstrap-servers BS --rate R --count N
           [--subject peer|processor] [--workers N] [--guarantee at-least-once|exactly-once]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def percentiles(values):
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": ordered[-1]}


def cpu_seconds(pid):
    """User and system CPU of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_cpu():
    """The whole machine's (idle, total) CPU ticks so far (/proc/stat's first line; idle counts
    iowait): what every process left idle, the broker's, the generator's and the reader's included."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return ticks[3] + ticks[4], sum(ticks[:8])


def peak_rss_mb(pid):
    """The peak resident memory of process `pid` so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) * 1024 / 1e6, 1)
    return None


def create_topics(bootstrap, topics, partitions):
    """The subject's topics, made before it starts: with CreateTopics, `partitions` each and the
    changelog compacted, as the processor makes them; on a broker whose metadata names no live
    controller (limit.c's mock cluster on a recent librdkafka, which cannot create topics then), by a
    metadata request, which the mock answers by creating the topic with its own partition count."""
    producer = Producer({"bootstrap.servers": bootstrap})
    metadata = producer.list_topics(timeout=30)
    created_by = "CreateTopics" if metadata.controller_id in metadata.brokers else "a metadata request"
    print(f"steady_latency: the topics made by {created_by}", file=sys.stderr)
    if metadata.controller_id in metadata.brokers:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        specs = [NewTopic(topic, partitions, -1, config={"cleanup.policy": "compact"} if name == "state" else {})
                 for name, topic in topics.items()]
        for topic, future in admin.create_topics(specs, request_timeout=30).items():
            future.result()
        return
    for topic in topics.values():
        if producer.list_topics(topic=topic, timeout=30).topics[topic].error is not None:
            sys.exit(f"the broker did not create {topic}")


# Once the load has ended, how long without a new outcome before the run is given up.
STALL_S = 30


def deleted_unread(bootstrap, topics):
    """Why outcomes may be missing: requests the broker deleted before they were read (a mock
    cluster keeps about 5 MB a partition), as a clause for the failure; empty when it deleted none."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "steady-latency-watermarks"})
    try:
        partitions = consumer.list_topics(topics["requests"], timeout=10).topics[topics["requests"]].partitions
        deleted = sum(consumer.get_watermark_offsets(TopicPartition(topics["requests"], p), timeout=10)[0]
                      for p in partitions)
    finally:
        consumer.close()
    return f": the broker deleted {deleted} requests by its retention, read or not" if deleted else ""


def start_subject(args, topics, group):
    """The peer or the processor on `topics`, answering each request once."""
    if args.subject == "peer":
        env = dict(os.environ, IN_TOPIC=topics["requests"], OUT_TOPIC=topics["outcomes"], GROUP=group, BATCH="1",
                   CCONF="fetch.wait.max.ms=10,topic.metadata.refresh.interval.ms=1000")
        return subprocess.Popen([sys.executable, args.peer, args.bootstrap_servers, str(args.count + 1)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # As `bench` runs it: the simulated controller at 0 ms answering purchased, the ledger and the
    # journal on, no state store, fetches waiting at most 10 ms.
    command = [args.binary, "run", "--bootstrap-servers", args.bootstrap_servers, "--group-id", group,
               "--requests-topic", topics["requests"], "--outcomes-topic", topics["outcomes"],
               "--entitlements-topic", topics["changes"], "--dead-letter-topic", topics["dead"],
               "--state-topic", topics["state"], "--partitions", str(args.partitions),
               "--controller", "simulated", "--simulated-latency-ms", "0", "--simulated-outcomes", "purchased=1",
               "--allow-simulated-production", "--state-dir", "none", "--guarantee", args.guarantee,
               "--log-level", "error", "-X", "fetch.wait.max.ms=10"]
    if args.workers:
        command += ["--workers", str(args.workers)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--rate", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--subject", choices=["peer", "processor"], default="peer")
    parser.add_argument("--peer", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench",
                                                       "peer_python.py"))
    parser.add_argument("--workers", type=int, default=0, help="the processor's --workers (default: its own)")
    parser.add_argument("--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once")
    parser.add_argument("--partitions", type=int, default=8,
                        help="partitions of the processor's topics where it creates them (a mock auto-creates its own)")
    parser.add_argument("--timeout-s", type=float, default=300)
    args = parser.parse_args()
    if args.subject == "peer" and args.guarantee != "at-least-once":
        parser.error("the peer runs at least once only")
    bootstrap = args.bootstrap_servers
    run = f"{int(time.time())}{random.randint(0, 999)}"
    topics = {name: f"bench.{args.subject}-steady-{run}.{name}"
              for name in ["requests", "outcomes", "changes", "dead", "state"]}

    visible, consumed, seen = [], [], set()
    warm = threading.Event()
    stop = threading.Event()

    def read():
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"steady-latency-reader-{run}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                           "topic.metadata.refresh.interval.ms": 1000,
                           "isolation.level": "read_committed" if args.guarantee == "exactly-once"
                           else "read_uncommitted"})
        reader.subscribe([topics["outcomes"]])
        while not stop.is_set():
            for message in reader.consume(num_messages=500, timeout=0.005):
                if message.error():
                    continue
                now_ms = time.time() * 1000
                outcome = json.loads(message.value())
                if outcome["request_id"] == "steady-latency-warm-up":
                    warm.set()
                    continue
                if outcome["request_id"] in seen:
                    continue
                seen.add(outcome["request_id"])
                visible.append(now_ms - outcome["requested_at_ms"])
                consumed.append(outcome["completed_at_ms"] - outcome["requested_at_ms"])
        reader.close()

    failures = []

    def read_or_report():
        try:
            read()
        except Exception as error:  # reported, and the wait below ends
            failures.append(repr(error))
            warm.set()

    # The topics exist before the subject starts (the processor checks its requests topic and
    # changelog at its start), the warm-up request in them.
    create_topics(bootstrap, topics, args.partitions)
    producer = Producer({"bootstrap.servers": bootstrap})
    warm_up = {"request_id": "steady-latency-warm-up", "app_id": "app_bench", "app_user_id": "warm-up",
               "product_id": "rc_pro_monthly", "store": "APP_STORE", "environment": "SANDBOX",
               "requested_at_ms": int(time.time() * 1000)}
    producer.produce(topics["requests"], json.dumps(warm_up).encode(), b"app_bench:warm-up")
    if producer.flush(30):
        sys.exit(f"the warm-up request to {topics['requests']} was not delivered within 30 s")
    subject = start_subject(args, topics, f"{args.subject}-steady-{run}")
    cpu, rss, reader = None, None, None
    try:
        reader = threading.Thread(target=read_or_report, daemon=True)
        reader.start()
        # (A subject that exits at its start ends the wait at once.)
        warm_deadline = time.monotonic() + args.timeout_s
        while not warm.wait(0.5) and subject.poll() is None and time.monotonic() < warm_deadline:
            pass
        if not warm.is_set() or failures:
            sys.exit(f"the {args.subject} did not answer the warm-up request (exit {subject.poll()}) {failures}")
        time.sleep(2)
        cpu_before = cpu_seconds(subject.pid)
        machine_before = machine_cpu()
        generator = subprocess.Popen(
            [args.binary, "generate", "--bootstrap-servers", bootstrap, "--topic", topics["requests"], "--users",
             "10000", "--rate", str(args.rate), "--count", str(args.count), "--log-level", "error"],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + args.timeout_s + args.count / args.rate
        answered_before, progress_at, load_ended_at = 0, time.monotonic(), None
        machine_until = machine_before
        # (Sampled while it runs: the peer exits once it has answered every request.)
        while (len(visible) < args.count or generator.poll() is None) and time.monotonic() < deadline \
                and not failures:
            if subject.poll() is None:
                try:
                    # (An exited process not yet waited for has no memory figures left.)
                    cpu, rss = cpu_seconds(subject.pid) - cpu_before, peak_rss_mb(subject.pid) or rss
                except OSError:
                    pass  # (it ended between the two)
            elif args.subject == "processor":
                failures.append(f"the processor exited with {subject.returncode}")
            if generator.poll() not in (None, 0):
                failures.append(f"the generator exited with {generator.returncode}")
            if generator.poll() is not None and load_ended_at is None:
                load_ended_at = time.monotonic()
            if len(visible) != answered_before:
                answered_before, progress_at = len(visible), time.monotonic()
                # (Taken when outcomes arrive: a stalled run's wait for them is not in the window.)
                machine_until = machine_cpu()
            elif load_ended_at is not None and time.monotonic() - max(progress_at, load_ended_at) > STALL_S:
                failures.append(f"no new outcome for {STALL_S} s, the load over{deleted_unread(bootstrap, topics)}")
            time.sleep(0.1)
        if generator.poll() is None:
            generator.kill()
        if subject.poll() is None:
            cpu, rss = cpu_seconds(subject.pid) - cpu_before, peak_rss_mb(subject.pid) or rss
    finally:
        stop.set()
        if reader is not None:
            reader.join(10)
        subject.kill()
        subject.wait()
    # The machine's idle share from the load's start to the last outcome read (within the 0.1 s the
    # loop sleeps): near 0, every core was busy, and the tail includes waits for a core (the broker's too).
    idle_pct = None
    if machine_until[1] > machine_before[1]:
        idle_pct = round(100 * (machine_until[0] - machine_before[0]) / (machine_until[1] - machine_before[1]), 1)
    report = {"subject": args.subject, "guarantee": args.guarantee, "offered_rate": args.rate, "count": args.count,
              "answered": len(visible), "failures": failures, "visible_ms": percentiles(visible),
              "consumed_ms": percentiles(consumed), "cpu_s": cpu,
              "cpu_us_per_request": round(cpu / max(1, len(visible)) * 1e6, 1) if cpu is not None else None,
              "peak_rss_mb": rss, "machine_idle_pct": idle_pct}
    print(json.dumps(report))
    return 0 if len(visible) == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
