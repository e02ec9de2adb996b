#!/usr/bin/env python3
"""The fair second peer of `make bench`: ../shared/bench/peer_python.py (confluent-kafka, no lanes),
plus the request journal a careful team would write by hand, so that a crash never calls billing
twice undeclared: for each consumed batch, an intent record per request, acknowledged (one flush)
before any call; then the outcome and a result record; the offset is committed once both are
delivered. A request whose result it remembers (in a dict) is not called again.

usage: peer_journal.py BOOTSTRAP N
env:   IN_TOPIC=events OUT_TOPIC=outcomes JOURNAL_TOPIC=peer-journal GROUP=peer-journal
       COMMIT_MS=1000 BATCH=500 LINGER_MS=5 CCONF="k=v,k=v" (extra consumer config)

Prints one line like peer_python.py's: RESULT impl=peer_journal ... rate=... client_cpu_s=...
"""
import json
import os
import resource
import sys
import time

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


def self_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    bootstrap, n = sys.argv[1], int(sys.argv[2])
    in_topic = os.environ.get("IN_TOPIC", "events")
    out_topic = os.environ.get("OUT_TOPIC", "outcomes")
    journal_topic = os.environ.get("JOURNAL_TOPIC", "peer-journal")
    commit_s = int(os.environ.get("COMMIT_MS", "1000")) / 1000.0
    batch = int(os.environ.get("BATCH", "500"))

    producer = Producer({
        "bootstrap.servers": bootstrap, "linger.ms": int(os.environ.get("LINGER_MS", "5")), "acks": "all",
        "enable.idempotence": True,
    })
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": os.environ.get("GROUP", "peer-journal"),
        "auto.offset.reset": "earliest", "enable.auto.commit": False, "enable.auto.offset.store": False,
        **dict(kv.split("=", 1) for kv in os.environ.get("CCONF", "").split(",") if kv),
    })

    partitions, offsets = [0] * n, [0] * n
    # Outputs still unacknowledged per consumed record (outcome and result record: 2).
    pending = bytearray(n)
    results = {}
    state = {"done": 0, "errors": 0}
    low, consumed = 0, 0
    commit_to = {}

    def on_delivery(seq):
        def callback(err, _msg):
            if err is not None:
                state["errors"] += 1
                print("delivery error:", err, file=sys.stderr)
                return
            pending[seq] -= 1
            if pending[seq] == 0:
                state["done"] += 1
        return callback

    def commit(asynchronous):
        nonlocal low
        while low < consumed and pending[low] == 0:
            commit_to[partitions[low]] = offsets[low] + 1
            low += 1
        if commit_to:
            consumer.commit(offsets=[TopicPartition(in_topic, p, o) for p, o in commit_to.items()],
                            asynchronous=asynchronous)
            commit_to.clear()

    def produce(topic, key, value, headers=None, callback=None):
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers, on_delivery=callback)
                return
            except BufferError:
                producer.poll(0.005)

    consumer.subscribe([in_topic])
    started = time.monotonic()
    first = None
    next_commit = 0.0
    while state["done"] < n:
        messages = consumer.consume(num_messages=batch, timeout=0.1) if consumed < n else []
        if not messages:
            producer.poll(0.01)
        work = []
        for message in messages:
            if message.error():
                if message.error().code() != KafkaError._PARTITION_EOF:
                    print("consume error:", message.error(), file=sys.stderr)
                continue
            if first is None:
                first, cpu_first = time.monotonic(), self_cpu()
                next_commit = first + commit_s
            event = json.loads(message.value())
            seq = consumed
            consumed += 1
            partitions[seq], offsets[seq] = message.partition(), message.offset()
            journal_key = f"{event['app_id']}:{event['app_user_id']}/{event['request_id']}".encode()
            if journal_key in results:
                state["done"] += 1
                continue
            now = int(time.time() * 1000)
            intent = {"request_id": event["request_id"], "attempts": 1, "started_at_ms": now,
                      "offset": message.offset()}
            produce(journal_topic, journal_key, json.dumps(intent, separators=(",", ":")).encode())
            work.append((seq, message, event, journal_key, intent))
        if work:
            # The intents are durable before any call.
            producer.flush()
        for seq, message, event, journal_key, intent in work:
            now = int(time.time() * 1000)
            outcome = {k: event[k] for k in ("request_id", "app_id", "app_user_id", "product_id", "store",
                                             "environment", "requested_at_ms") if k in event}
            for k in ("placement_id", "promo_offer_id"):
                if event.get(k) is not None:
                    outcome[k] = event[k]
            outcome.update(result="purchased", attempts=1, completed_at_ms=now, controller="simulated")
            headers = [("ce_specversion", b"1.0"), ("ce_id", ("outcome:" + event["request_id"]).encode()),
                       ("ce_source", b"/peer"), ("ce_type", b"com.encorekit.purchase.outcome.v1"),
                       ("content-type", b"application/json")]
            pending[seq] = 2
            produce(out_topic, message.key(), json.dumps(outcome, separators=(",", ":")).encode(), headers,
                    on_delivery(seq))
            intent.update(result="purchased", completed_at_ms=now)
            produce(journal_topic, journal_key, json.dumps(intent, separators=(",", ":")).encode(), None,
                    on_delivery(seq))
            results[journal_key] = "purchased"
        producer.poll(0)
        if state["errors"]:
            sys.exit("delivery errors")
        if first is not None and time.monotonic() >= next_commit:
            commit(True)
            next_commit = time.monotonic() + commit_s
    commit(False)
    elapsed = time.monotonic() - first
    cpu = self_cpu() - cpu_first
    print(f"RESULT impl=peer_journal lib=confluent-kafka-{confluent_kafka.__version__}/"
          f"librdkafka-{confluent_kafka.libversion()[0]} bootstrap={bootstrap} n={n} batch={batch} "
          f"elapsed_s={elapsed:.3f} rate={n / elapsed:.0f} join_s={first - started:.2f} "
          f"client_cpu_s={cpu:.2f} client_cores={cpu / elapsed:.2f}", flush=True)
    consumer.close()
    producer.flush(5)


if __name__ == "__main__":
    main()
