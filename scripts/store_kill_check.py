#!/usr/bin/env python3
"""The local state store across SIGKILLs at random points: never trusted and wrong.

Against a running broker (Tansu in CI): produces --requests requests of --users users, runs one
processor with a state store (--state-dir) and a short commit interval (the store is written
every 50 ms, so kills land in and between its writes), and SIGKILLs it --kills times, each at a
random moment within --kill-window-s after its restore. After each kill, before the restart,
`state-check` compares the store as the kill left it with the changelog: a partition a restore
would trust must hold exactly the changelog's latest record of each key below its checkpoint.

Then a last process answers the rest and stops cleanly (SIGTERM); the store must then be
consistent in every partition, and a restart on it must read no changelog record from its
checkpoints and rebuild no partition (a clean stop leaves nothing to read, Tansu's short report
of a partition's end included). Every request must have an outcome.

Last, --rebuild-kills times, the store is removed and a fresh start, which rebuilds it from the
changelog (its writes not logged, flushed at the end), is SIGKILLed at a random moment within
--rebuild-window-s of its assignment: the store it leaves must not be trusted and wrong either.

Prints one JSON line; exits 1 on a failure.
"""
import argparse
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer, TopicPartition

PARTITIONS = 4
RESTORED = re.compile(r"restored the ledger state of .*?: (\d+) changelog records read from the checkpoints "
                      r"\((\d+) partitions rebuilt from the beginning\), (\d+) from the state store")
ASSIGNED = "[encore.consumer] assigned"


def outcome_ids(bootstrap, topic):
    """Request ids of every outcome in the topic now (read to each partition's end)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"store-check-{random.random()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen, ended, deadline = set(), set(), time.time() + 30
    while len(ended) < PARTITIONS and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            ended.add(message.partition())
            continue
        ended.discard(message.partition())
        seen.add(json.loads(message.value())["request_id"])
    consumer.close()
    return seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--requests", type=int, default=30000)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--kill-window-s", type=float, default=4.0)
    parser.add_argument("--rebuild-kills", type=int, default=3)
    parser.add_argument("--rebuild-window-s", type=float, default=1.5)
    parser.add_argument("--timeout-s", type=float, default=480)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randint(0, 1 << 30)
    rng = random.Random(seed)
    run = f"{int(time.time())}{random.randint(0, 999)}"
    group = f"store-check-{run}"
    # The state store and the processes' log: removed when the check passes, kept when it fails.
    work = tempfile.mkdtemp(prefix=f"store-check-{run}-")
    state_dir = f"{work}/state"
    log_path = f"{work}/processor.log"
    topics = {name: f"skc{run}.{name}" for name in ["requests", "outcomes", "changes", "dead", "state"]}
    flags = ["--bootstrap-servers", args.bootstrap_servers, "--requests-topic", topics["requests"],
             "--outcomes-topic", topics["outcomes"], "--entitlements-topic", topics["changes"],
             "--dead-letter-topic", topics["dead"], "--state-topic", topics["state"]]
    subprocess.run([args.binary, "topics", "create", "--partitions", str(PARTITIONS)] + flags, check=True,
                   stdout=subprocess.DEVNULL)
    producer = Producer({"bootstrap.servers": args.bootstrap_servers, "enable.idempotence": True,
                         "linger.ms": 20})
    ids = []
    for index in range(args.requests):
        request_id = f"skc-{run}-{index}"
        ids.append(request_id)
        user = f"user-{index % args.users}"
        event = {"request_id": request_id, "app_id": "app_skc", "app_user_id": user,
                 "product_id": "com.app.pro", "store": "APP_STORE", "environment": "SANDBOX",
                 "requested_at_ms": int(time.time() * 1000),
                 # A grant changes the user's state: state records go to the store beside the journal's.
                 "entitlement": {"type": "credit", "value": 1 + index % 7, "unit": "dollars"}}
        producer.produce(topics["requests"], json.dumps(event).encode(), f"app_skc:{user}".encode())
    producer.flush(60)

    def log_text():
        with open(log_path) as log:
            return log.read()

    def start():
        return subprocess.Popen(
            [args.binary, "run", "--group-id", group, "--instance-id", "store-check", "--workers", "1",
             "--controller", "simulated", "--simulated-latency-ms", "5", "--simulated-outcomes", "purchased=1",
             "--max-in-flight", "8", "--commit-interval-ms", "50", "--log-level", "info",
             # A killed process leaves open intents, which hold their users at the restart for the
             # call timeout and the skew margin: short, so each run has time to write between kills.
             "--call-timeout-ms", "1000", "--clock-skew-margin-ms", "500",
             "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500", "--state-dir", state_dir] + flags,
            stdout=subprocess.DEVNULL, stderr=open(log_path, "a"))

    def state_check():
        result = subprocess.run(
            [args.binary, "state-check", "--json", "--state-dir", state_dir, "--group-id", group,
             "--bootstrap-servers", args.bootstrap_servers, "--state-topic", topics["state"], "--log-level", "warning"],
            capture_output=True, text=True, timeout=180)
        if result.returncode not in (0, 1):
            raise SystemExit(f"state-check failed ({result.returncode}): {result.stderr.strip()}")
        return json.loads(result.stdout)

    def wait_restored(process, before, deadline):
        """Waits for a restore line past the `before` ones; returns its figures."""
        while time.monotonic() < deadline and process.poll() is None:
            found = RESTORED.findall(log_text())
            if len(found) > before:
                return [int(value) for value in found[before]]
            time.sleep(0.2)
        return None

    def restores():
        return len(RESTORED.findall(log_text()))

    def kill_and_check(process, window_s):
        """SIGKILLs the process at a random moment within `window_s`, then checks the store it left;
        returns the delay, state-check's report and its verdicts."""
        delay = rng.uniform(0, window_s)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        check = state_check()
        return delay, check, [partition["verdict"] for partition in check["partitions"]]

    report = {"seed": seed, "requests": len(ids), "log": log_path, "kills": []}
    failures = []
    started = time.monotonic()
    deadline = started + args.timeout_s
    open(log_path, "a").close()
    for kill in range(args.kills):
        before = restores()
        process = start()
        figures = wait_restored(process, before, deadline)
        if figures is None:
            process.kill()
            failures.append(f"run {kill + 1} did not restore (exit {process.poll()})")
            break
        delay, check, verdicts = kill_and_check(process, args.kill_window_s)
        report["kills"].append({
            "after_restore_s": round(delay, 2), "restore": dict(zip(["changelog_records", "rebuilt", "from_store"],
                                                                    figures)),
            "verdicts": verdicts, "store_records_matching": sum(p["matching"] for p in check["partitions"])})
        if not check["safe"]:
            failures.append(f"after kill {kill + 1} a store a restore would trust differs: {check['partitions']}")
    process = start()
    answered = set()
    if not failures:
        while time.monotonic() < deadline and process.poll() is None:
            answered = outcome_ids(args.bootstrap_servers, topics["outcomes"])
            if len(answered & set(ids)) == len(ids):
                break
            time.sleep(2)
    process.terminate()
    try:
        process.wait(90)
    except subprocess.TimeoutExpired:
        process.kill()
        failures.append("the last process did not stop within 90 s of SIGTERM")
    report["missing_outcomes"] = len(set(ids) - answered)
    if report["missing_outcomes"]:
        failures.append(f"{report['missing_outcomes']} requests without an outcome")
    if not failures:
        check = state_check()
        report["after_clean_stop"] = [partition["verdict"] for partition in check["partitions"]]
        if any(verdict != "consistent" for verdict in report["after_clean_stop"]) or not check["partitions"]:
            failures.append(f"after a clean stop the store is not consistent: {check['partitions']}")
        # A restart on a store a clean stop left: nothing to read, nothing rebuilt.
        before = restores()
        process = start()
        figures = wait_restored(process, before, deadline)
        process.terminate()
        try:
            process.wait(90)
        except subprocess.TimeoutExpired:
            process.kill()
        if figures is None:
            failures.append("the restart after a clean stop did not restore")
        else:
            report["restart_after_clean_stop"] = dict(zip(["changelog_records", "rebuilt", "from_store"], figures))
            if figures[0] != 0 or figures[1] != 0:
                failures.append(f"the restart after a clean stop read the changelog: {figures}")
    report["rebuild_kills"] = []
    for kill in range(args.rebuild_kills if not failures else 0):
        shutil.rmtree(state_dir, ignore_errors=True)
        before, assigned = restores(), log_text().count(ASSIGNED)
        process = start()
        while time.monotonic() < deadline and process.poll() is None and log_text().count(ASSIGNED) == assigned:
            time.sleep(0.05)
        if process.poll() is not None or time.monotonic() >= deadline:
            process.kill()
            failures.append(f"rebuild run {kill + 1} was not assigned its partitions (exit {process.poll()})")
            break
        delay, check, verdicts = kill_and_check(process, args.rebuild_window_s)
        report["rebuild_kills"].append({
            "after_assignment_s": round(delay, 2), "in_the_restore": restores() == before, "verdicts": verdicts,
            "store_records_matching": sum(p["matching"] for p in check["partitions"])})
        if not check["safe"]:
            failures.append(f"after rebuild kill {kill + 1} a store a restore would trust differs: {check['partitions']}")
    report["seconds"] = round(time.monotonic() - started, 1)
    report["failures"] = failures
    print(json.dumps(report))
    if not failures:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
