#!/usr/bin/env python3
"""What the broker and a client loop add to request→outcome latency, without the processor.

Runs the Python peer (../shared/bench/peer_python.py) under the steady load `bench --rate` offers
the processor: the same generator (`encore-processor generate`, 10,000 users), the same rate, on
the same kind of broker. A reader takes the peer's outcomes as they arrive and measures, per
request, from its `requested_at_ms` (set when the generator produced it):

  - visible_ms: to the outcome reaching this reader (an upper bound of the peer's
    "outcome acknowledged": the reader's fetch comes on top);
  - consumed_ms: to the peer decoding it (the outcome's `completed_at_ms`), the consumer side.

The peer and the reader wait at most 10 ms per fetch, as `bench` configures the processor (the mock
cluster and Tansu hold a fetch for its whole wait instead of answering when data arrives); the peer
polls one record at a time (BATCH=1) and the reader takes what has arrived every 5 ms, so neither
waits to fill a batch.

The first request is a warm-up (the peer's group join is not latency), then 2 s pass, as in
`bench --rate`. Prints one JSON object with p50/p90/p99/max of both; exits 1 if outcomes are missing.

usage: peer_latency.py --binary .build/release/encore-processor --bootstrap-servers BS --rate R --count N
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

from confluent_kafka import Consumer, Producer

REQUESTS = "bench.peer-steady-requests"
OUTCOMES = "bench.peer-steady-outcomes"


def percentiles(values):
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": ordered[-1]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--rate", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--peer", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench",
                                                       "peer_python.py"))
    parser.add_argument("--timeout-s", type=float, default=300)
    args = parser.parse_args()
    bootstrap = args.bootstrap_servers

    visible, consumed, seen = [], [], set()
    warm = threading.Event()
    stop = threading.Event()

    def read():
        reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peer-latency-reader-{time.time()}",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                           "topic.metadata.refresh.interval.ms": 1000})
        reader.subscribe([OUTCOMES])
        while not stop.is_set():
            for message in reader.consume(num_messages=500, timeout=0.005):
                if message.error():
                    continue
                now_ms = time.time() * 1000
                outcome = json.loads(message.value())
                if outcome["request_id"] == "peer-latency-warm-up":
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

    reader = threading.Thread(target=read_or_report, daemon=True)
    reader.start()
    env = dict(os.environ, IN_TOPIC=REQUESTS, OUT_TOPIC=OUTCOMES, GROUP=f"peer-steady-{time.time()}", BATCH="1",
               CCONF="fetch.wait.max.ms=10,topic.metadata.refresh.interval.ms=1000")
    peer = subprocess.Popen([sys.executable, args.peer, bootstrap, str(args.count + 1)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        producer = Producer({"bootstrap.servers": bootstrap})
        warm_up = {"request_id": "peer-latency-warm-up", "app_id": "app_bench", "app_user_id": "warm-up",
                   "product_id": "rc_pro_monthly", "store": "APP_STORE", "environment": "SANDBOX",
                   "requested_at_ms": int(time.time() * 1000)}
        producer.produce(REQUESTS, json.dumps(warm_up).encode(), b"app_bench:warm-up")
        producer.flush(30)
        if not warm.wait(args.timeout_s) or failures:
            sys.exit(f"the peer did not answer the warm-up request {failures}")
        time.sleep(2)
        subprocess.run([args.binary, "generate", "--bootstrap-servers", bootstrap, "--topic", REQUESTS,
                        "--users", "10000", "--rate", str(args.rate), "--count", str(args.count),
                        "--log-level", "error"], check=True, stdout=subprocess.DEVNULL,
                       timeout=args.timeout_s + args.count / args.rate)
        deadline = time.monotonic() + args.timeout_s
        while len(visible) < args.count and time.monotonic() < deadline and not failures:
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join(10)
        peer.kill()
        peer.wait()
    report = {"offered_rate": args.rate, "count": args.count, "answered": len(visible), "failures": failures,
              "visible_ms": percentiles(visible), "consumed_ms": percentiles(consumed)}
    print(json.dumps(report))
    return 0 if len(visible) == args.count else 1


if __name__ == "__main__":
    sys.exit(main())
