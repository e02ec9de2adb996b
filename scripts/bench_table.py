#!/usr/bin/env python3
"""The README's benchmark table from several `make bench` logs (scripts/bench.sh's table at the end
of each): each cell the last log's figure and, in brackets, the lowest and highest over all logs.

Ratios are worked out again from each run's own throughputs (limit.c, the peers and the 0 ms rows
of that run), so each bracket spans ratios within one run, never across two.

usage: scripts/bench_table.py run1.log run2.log run3.log   (the cells give the last one's figures)
"""
import re
import sys

# Each row of bench.sh's table by how its label starts: (key, pattern). The two Tansu backlog rows
# share a label but for their count: the first is the 300,000 row, the second the memory row.
LABELS = [
    ("limit", r"limit\.c"),
    ("peer", r"Python peer \(confluent-kafka"),
    ("journal_peer", r"Python peer with a journal"),
    ("journal_limit", r"journal_limit\.c"),
    ("alo", r"processor, 0 ms(?: controller)?, at-least-once(?: \(\d+ backlog\))?\s"),
    ("debian", r"the same, on Debian"),
    ("slow", r"processor, 20 ms"),
    ("eos", r"processor, 0 ms(?: controller)?, exactly-once"),
    ("half_alo", r"processor at \d+/s(?: offered)?, (?:half its rate, )?at-least-once"),
    ("half_eos", r"processor at \d+/s, half its rate, exactly-once"),
    ("half_debian", r"the same at-least-once, on Debian"),
    ("half_peer", r"Python peer at \d+/s"),
    ("scale1", r"scale-out: 1 instances"),
    ("scale2", r"scale-out: 2 instances"),
    ("scale3", r"scale-out: 3 instances"),
]
EXPECTED = {("mock", key) for key, _ in LABELS if not key.startswith("scale") and key != "journal_limit"}
EXPECTED |= {("tansu", key) for key in ("limit", "peer", "journal_peer", "journal_limit", "alo", "eos", "slow", "half_alo",
                                         "half_peer", "backlog", "scale1", "scale2", "scale3")}


def number(text):
    try:
        return float(text)
    except ValueError:
        return None


def parse(path):
    """{(broker, key): fields} of one log: the throughput (`rate`, requests a second; a steady row's
    offered rate, with `offered` and `answered` counts) and the row's trailing figures."""
    rows = {}
    with open(path, encoding="utf-8") as log:
        lines = log.read().splitlines()
    # Logs of earlier releases' bench.sh have no broker column.
    has_broker = any(re.match(r"^broker\s+scenario\s.*\sbroker µs\s*$", line) for line in lines)
    for line in lines:
        match = re.match(r"^(mock|tansu)\s+(.*)$", line)
        if not match:
            continue
        broker, rest = match.groups()
        key = next((key for key, pattern in LABELS if re.match(pattern, rest)), None)
        if key is None:
            continue
        if key == "alo" and (broker, "alo") in rows:
            key = "backlog"
        if (broker, key) in rows:
            sys.exit(f"{path}: two rows for {broker} {key}: {line}")
        tokens = rest.split()
        fields = {}
        if has_broker:
            fields["broker"] = number(tokens.pop())
        if key.startswith("half_"):
            # 10 seconds of the offered rate (bench.sh's steady_row); "?" answered when the run failed.
            counted = re.search(r"\s(\S+) of (\d+)\s", rest)
            fields["offered"] = int(counted.group(2))
            fields["rate"] = fields["offered"] // 10
            fields["answered"] = int(counted.group(1)) if counted.group(1).isdigit() else None
        else:
            # The throughput: the first "N/s" token (no other label holds one); "?" when the run failed.
            fields["rate"] = next((int(t[:-2]) for t in tokens if re.fullmatch(r"\d+/s", t)), None)
        if key != "limit":
            p50, p99, _cpu_seconds, cpu, rss = tokens[-5:]
            fields.update(p50=number(p50), p99=number(p99), cpu=number(cpu), rss=number(rss))
        idle = re.search(r"machine ([\d.]+)% idle", rest)
        if idle:
            fields["idle"] = float(idle.group(1))
        bound = re.search(r"([\d.]+)% of bound", rest)
        if bound:
            fields["of_bound"] = float(bound.group(1))
        pause = re.search(r"pause (\d+) ms", rest)
        if pause:
            fields["pause"] = int(pause.group(1)) / 1000
        rows[(broker, key)] = fields
    missing = sorted(EXPECTED - rows.keys())
    if missing:
        print(f"{path}: no row for {', '.join(f'{b} {k}' for b, k in missing)}", file=sys.stderr)
    return rows


def spread(values, render, after="", bracket_after=""):
    """The last value, then `after`, then the lowest–highest of all in brackets (left out when they
    are one), the way the README writes them: "6.5% (6.5–8.0%)", "0.80 × peer (0.53–0.80)"."""
    if values[-1] is None:
        return "?"
    known = [v for v in values if v is not None]
    low, high = render(min(known)), render(max(known))
    told = f"{render(values[-1])}{after}"
    return told if low == high else f"{told} ({low}–{high}{bracket_after})"


def thousands(value):
    return f"{value:,.0f}"


def one_place(value):
    return f"{value:.1f}"


def two_places(value):
    return f"{value:.2f}"


class Table:
    def __init__(self, runs):
        self.runs = runs

    def figures(self, broker, key, field):
        return [run.get((broker, key), {}).get(field) for run in self.runs]

    def ratios(self, broker, key, to):
        return [None if not (a and b) else a / b
                for a, b in zip(self.figures(broker, key, "rate"), self.figures(broker, to, "rate"))]

    def rate(self, broker, key):
        return spread(self.figures(broker, key, "rate"), thousands, "/s")

    def of_limit(self, broker, key):
        return spread([r and r * 100 for r in self.ratios(broker, key, "limit")], one_place, "%", "%")

    def times(self, broker, key, to, name):
        return spread(self.ratios(broker, key, to), two_places, f" × {name}")

    def backlog_ratio(self, broker, key):
        return (f"{self.of_limit(broker, key)}; {self.times(broker, key, 'peer', 'peer')}, "
                f"{self.times(broker, key, 'journal_peer', 'journaling peer')}")

    def eos_ratio(self, broker):
        return f"{self.of_limit(broker, 'eos')}; {self.times(broker, 'eos', 'alo', 'at-least-once')}"

    def of_bound(self, broker, mark):
        return spread(self.figures(broker, "slow", "of_bound"), thousands, f"% of min(50,000/s, 0 ms){mark}", "%")

    def cpu(self, broker, key):
        return spread(self.figures(broker, key, "cpu"), thousands)

    def broker_cpu(self, broker, key):
        return spread(self.figures(broker, key, "broker"), one_place) if any(self.figures(broker, key, "broker")) else ""

    def rss(self, broker, key):
        return spread(self.figures(broker, key, "rss"), thousands, " MB")

    def latency(self, broker, key, field):
        return spread(self.figures(broker, key, field), thousands, " ms")

    def offered(self, broker, key):
        final = self.runs[-1].get((broker, key))
        if not final:
            return "?"
        answered = self.figures(broker, key, "answered")
        every = all(a is not None and a == o for a, o in zip(answered, self.figures(broker, key, "offered")))
        told = f"{thousands(final['rate'])}/s offered, "
        if final["answered"] == final["offered"]:
            told += f"all {thousands(final['offered'])} answered"
        else:
            answered = "?" if final["answered"] is None else thousands(final["answered"])
            told += f"{answered} of {thousands(final['offered'])} answered"
        return told + (" (each run all)" if every else " (not all in every run)")

    def steady(self, broker, shown, key, scenario):
        # (Logs of earlier releases have no idle figure: the bracket spans the logs that have one.)
        idle = self.figures(broker, key, "idle")
        if idle[-1] is not None:
            scenario += "; the machine " + spread(idle, one_place, "% idle", "%")
        return [shown, scenario, self.offered(broker, key), "", self.latency(broker, key, "p50"),
                self.latency(broker, key, "p99"), self.cpu(broker, key), self.broker_cpu(broker, key),
                self.rss(broker, key)]

    def backlog(self, broker, key, scenario, ratio):
        return [broker, scenario, self.rate(broker, key), ratio, "", "", self.cpu(broker, key),
                self.broker_cpu(broker, key), self.rss(broker, key)]

    def peers(self, broker, journal_scenario):
        return [
            [broker, "limit.c consume→produce→commit", self.rate(broker, "limit"), "", "", "", "",
             self.broker_cpu(broker, "limit"), ""],
            [broker, "Python peer (confluent-kafka, no lanes, no ledger)" if broker == "mock" else "Python peer",
             self.rate(broker, "peer"), self.of_limit(broker, "peer"), "", "", self.cpu(broker, "peer"),
             self.broker_cpu(broker, "peer"), ""],
            [broker, journal_scenario, self.rate(broker, "journal_peer"), self.of_limit(broker, "journal_peer"), "",
             "", self.cpu(broker, "journal_peer"), self.broker_cpu(broker, "journal_peer"), ""],
        ]

    def rows(self):
        """The README's rows, in its order and words."""
        mock, tansu = "mock", "tansu"
        return self.peers(mock, "Python peer with a journal (acked intent before the call, result record)⁵") + [
            self.backlog(mock, "alo", "0 ms controller, at-least-once", self.backlog_ratio(mock, "alo")),
            self.backlog(mock, "debian", "the same, on Debian's librdkafka 2.0.2 (the image's)",
                         self.backlog_ratio(mock, "debian")),
            self.backlog(mock, "slow", "20 ms controller, 1000 in flight, at-least-once", self.of_bound(mock, "²")),
            self.backlog(mock, "eos", "0 ms controller, exactly-once", self.eos_ratio(mock)),
            self.steady(mock, "mock³", "half_alo", "half of its 0 ms rate offered, at-least-once⁴"),
            self.steady(mock, "mock³", "half_debian", "the same, on Debian's librdkafka 2.0.2 (the image's)⁴"),
            self.steady(mock, "mock³", "half_eos", "half of its 0 ms rate offered, exactly-once⁴"),
            self.steady(mock, "mock³", "half_peer", "Python peer at at-least-once's half rate: the broker's own⁴"),
        ] + self.peers(tansu, "Python peer with a journal⁵") + [
            [tansu, "journal_limit.c: the processor's writes alone (3 acked in sequence a request, 5,000 at once)⁷",
             self.rate(tansu, "journal_limit"), self.of_limit(tansu, "journal_limit"), "", "",
             self.cpu(tansu, "journal_limit"), self.broker_cpu(tansu, "journal_limit"), ""],
            self.backlog(tansu, "alo", "0 ms controller, at-least-once, 300,000 backlog",
                         self.backlog_ratio(tansu, "alo")),
            self.backlog(tansu, "eos", "0 ms controller, exactly-once, 300,000 backlog (no `read_committed` reader: "
                         "latency on the mock only)", self.eos_ratio(tansu)),
            self.backlog(tansu, "slow", "20 ms controller, 1000 in flight, at-least-once", self.of_bound(tansu, "")),
            self.steady(tansu, tansu, "half_alo", "half of 0 ms offered, at-least-once⁴"),
            self.steady(tansu, tansu, "half_peer", "Python peer at the same rate: the broker's own⁴"),
            self.backlog(tansu, "backlog", "0 ms controller, at-least-once, 1,000,000 backlog (default settings)", ""),
            [tansu, "scale-out⁶: 1 instance, 12 partitions", self.rate(tansu, "scale1"), self.of_limit(tansu, "scale1"),
             "", "", self.cpu(tansu, "scale1"), "", ""],
        ] + [
            [tansu, f"scale-out⁶: {n} instances", self.rate(tansu, f"scale{n}"),
             "rebalance pause " + spread(self.figures(tansu, f"scale{n}", "pause"), one_place, " s"), "", "",
             self.cpu(tansu, f"scale{n}"), "", ""]
            for n in (2, 3)
        ]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    table = Table([parse(path) for path in sys.argv[1:]])
    print("| broker | scenario | throughput | ratio | p50 | p99 | CPU µs/request | broker's CPU µs/request | peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cells in table.rows():
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
