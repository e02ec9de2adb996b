#!/usr/bin/env python3
"""Exactly-once: an intent held past the committed end is never recovered under its own attempt.

Against a running broker that holds read_committed readers behind an open transaction (Tansu in
CI, which never times one out). A foreign transactional producer writes to the changelog, in the
partition of one request's user, that request's intent of attempt 1 and commits it; then its
intent of attempt 2 in a transaction it leaves open: what a restore sees when the broker leaves an
owner's committed transaction undecided (scripts/tansu_txn_race.py), or when an owner died in it.
Then the request arrives and an exactly-once processor restores the partition: the open
transaction holds its committed end short of the end, the restore settles there after its wait,
reads what is held without isolation, and must recover the request under attempt 3, a recovery
call. Before, it saw only attempt 1 and called attempt 2 again: a second call under one attempt
number, which the chaos run's outcome check counts as an undeclared repeat.

Checked twice, on fresh topics: with a state store (the restore reads the changelog from its
checkpoints; its users read from the store as needed) and with none (--state-dir none: the
changelog read from the beginning).

Prints one JSON line per check; exits 1 when an outcome is not attempt 3, or none comes within
--timeout-s.
"""
import argparse
import json
import random
import subprocess
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

PARTITIONS = 4
PARTITION = 1


def journal(user, request_id, attempts, started_at_ms):
    """A journal record (schemas/request-journal.schema.json): the request's open intent."""
    key = f":0:app_held:{user}".encode()
    value = {"app_id": "app_held", "app_user_id": user, "journal_seq": 0, "request_id": request_id,
             "attempts": attempts, "started_at_ms": started_at_ms}
    return key, json.dumps(value).encode()


def check(args, store):
    """One check on topics of its own; returns its report."""
    run = f"{int(time.time())}{random.randint(0, 999)}"
    topics = {name: f"held{run}.{name}" for name in ["requests", "outcomes", "changes", "dead", "state"]}
    flags = ["--bootstrap-servers", args.bootstrap_servers, "--requests-topic", topics["requests"],
             "--outcomes-topic", topics["outcomes"], "--entitlements-topic", topics["changes"],
             "--dead-letter-topic", topics["dead"], "--state-topic", topics["state"]]
    subprocess.run([args.binary, "topics", "create", "--partitions", str(PARTITIONS)] + flags, check=True,
                   stdout=subprocess.DEVNULL)
    user, request_id = "user-0", f"held-{run}"
    # Long ago: the takeover hold (the intent's time plus the call timeout and skew margin) is over.
    started = int(time.time() * 1000) - 120_000
    foreign = Producer({"bootstrap.servers": args.bootstrap_servers, "transactional.id": f"held-{run}"})
    foreign.init_transactions(30)
    foreign.begin_transaction()
    key, value = journal(user, request_id, 1, started)
    foreign.produce(topics["state"], value, key, partition=PARTITION)
    foreign.commit_transaction(30)
    foreign.begin_transaction()
    key, value = journal(user, request_id, 2, started + 1)
    foreign.produce(topics["state"], value, key, partition=PARTITION)
    foreign.flush(30)  # written, its transaction left open

    requests = Producer({"bootstrap.servers": args.bootstrap_servers, "enable.idempotence": True})
    event = {"request_id": request_id, "app_id": "app_held", "app_user_id": user, "product_id": "com.app.pro",
             "store": "APP_STORE", "environment": "SANDBOX", "requested_at_ms": int(time.time() * 1000)}
    requests.produce(topics["requests"], json.dumps(event).encode(), f"app_held:{user}".encode(),
                     partition=PARTITION)
    requests.flush(30)

    log_path = f"/tmp/held-intent-check-{run}.log"
    processor = subprocess.Popen(
        [args.binary, "run", "--group-id", f"held-{run}", "--guarantee", "exactly-once", "--instance-id",
         "held-check", "--workers", "1", "--controller", "simulated", "--simulated-latency-ms", "1",
         "--simulated-outcomes", "purchased=1", "--log-level", "warning",
         # The restore settles for the committed end 5 s past this: a short check.
         "-X", "transaction.timeout.ms=2000",
         "--state-dir", f"/tmp/held-intent-check-{run}-state" if store else "none"] + flags,
        stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
    consumer = Consumer({"bootstrap.servers": args.bootstrap_servers, "group.id": f"held-check-{run}",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    consumer.assign([TopicPartition(topics["outcomes"], p, 0) for p in range(PARTITIONS)])
    outcomes, deadline = [], time.monotonic() + args.timeout_s
    while not outcomes and time.monotonic() < deadline and processor.poll() is None:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            outcome = json.loads(message.value())
            if outcome["request_id"] == request_id:
                outcomes.append(outcome)
    consumer.close()
    processor.terminate()
    try:
        processor.wait(60)
    except subprocess.TimeoutExpired:
        processor.kill()
        processor.wait()
    foreign.abort_transaction(30)
    log = open(log_path, errors="replace").read()
    report = {
        "store": store,
        "outcome_attempts": outcomes[0]["attempts"] if outcomes else None,
        "outcome_result": outcomes[0]["result"] if outcomes else None,
        "settled_for_the_committed_end": "read to the committed end" in log,
        "held_intents_read": "held past the committed end, without isolation: 1 intents of 1 requests" in log,
        "log": log_path,
    }
    print(json.dumps(report), flush=True)
    report["failed"] = report["outcome_attempts"] != 3 or not report["settled_for_the_committed_end"] or \
        not report["held_intents_read"]
    if report["failed"]:
        sys.stderr.write(log[-4000:])
    return report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--timeout-s", type=float, default=120)
    args = parser.parse_args()
    reports = [check(args, store=True), check(args, store=False)]
    return 1 if any(report["failed"] for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
