#!/usr/bin/env python3
"""The status page of a running processor, opened in headless Chromium.

Starts a broker (`encore-processor broker`), a processor with `--http-listen` on a free loopback
port, and sends it requests (some invalid, for dead letters and warnings). Once every request has
an outcome or a dead letter and `/status` holds still, it opens `/` in the browser and checks:
no console errors; every number the page shows (each tagged `data-status="<path>"`) equals the
same path in `/status`; the partitions, outcomes, dead letters and last warnings of `/status` are
all on the page. `--screenshot PNG` saves what the browser shows (the README's picture).

    check_status_page.py BINARY [--screenshot docs/status-page.png]

Exit status 0 when every check passes, 1 otherwise. Everything it starts is stopped on exit.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browser_check import open_page  # noqa: E402

# Numbers that move while the page is read (time, CPU, memory): compared for presence only.
MOVING = {"uptime_seconds", "cpu_seconds", "resident_bytes", "in_doubt.oldest_age_seconds"}


def get(url):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def wait_for(condition, what, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what} within {timeout_s} s")


def flatten(status):
    """`/status` as path -> number, the paths the page tags its numbers with."""
    paths = {}
    for key, value in status.items():
        if isinstance(value, bool) or isinstance(value, str) or key in ("reasons", "last_errors"):
            continue
        if isinstance(value, (int, float)):
            paths[key] = value
        elif key == "in_doubt" or key == "rebalances":
            for inner, number in value.items():
                if isinstance(number, (int, float)) and not isinstance(number, bool):
                    paths[f"{key}.{inner}"] = number
        elif key in ("outcomes", "dead_letters"):
            for entry in value:
                paths[f"{key}.{entry['name']}"] = entry["count"]
        elif key == "partitions":
            for entry in value:
                base = f"partitions.{entry['topic']}/{entry['partition']}"
                for field in ("lag", "next_offset", "high_watermark"):
                    if entry.get(field) is not None:
                        paths[f"{base}.{field}"] = entry[field]
    paths["version"] = status["version"]
    return paths


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--screenshot")
    parser.add_argument("--count", type=int, default=300)
    arguments = parser.parse_args()
    binary = os.path.abspath(arguments.binary)
    work = tempfile.mkdtemp(prefix="encore-status-")
    children = []
    failures = []
    try:
        broker = subprocess.Popen([binary, "broker", "--partitions", "2"], stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(work, "broker.log"), "w"), text=True)
        children.append(broker)
        servers = None
        deadline = time.monotonic() + 60
        while servers is None and time.monotonic() < deadline and broker.poll() is None:
            line = broker.stdout.readline()
            if line.startswith("bootstrap.servers="):
                servers = line.strip().split("=", 1)[1]
        if servers is None:
            raise RuntimeError("the broker did not say its bootstrap.servers")
        log = os.path.join(work, "processor.log")
        processor = subprocess.Popen(
            [binary, "run", "--bootstrap-servers", servers, "--controller", "simulated", "--simulated-latency-ms",
             "0", "--http-listen", "127.0.0.1:0", "--state-dir", os.path.join(work, "state")],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        children.append(processor)

        def port():
            found = re.search(r"operations endpoint listening on http://127\.0\.0\.1:([0-9]+)", open(log).read())
            return found and found.group(1)

        base = f"http://127.0.0.1:{wait_for(port, 'the operations endpoint in the log', 60)}"
        wait_for(lambda: get(f"{base}/readyz").startswith("ok"), "the processor ready", 120)
        subprocess.run([binary, "generate", "--bootstrap-servers", servers, "--count", str(arguments.count),
                        "--invalid-ratio", "0.05", "--seed", "5"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)

        def settled():
            status = json.loads(get(f"{base}/status"))
            done = sum(entry["count"] for entry in status["outcomes"] + status["dead_letters"])
            lagging = [p for p in status["partitions"] if p.get("lag") != 0]
            return status if done >= arguments.count and status["partitions"] and not lagging else None

        wait_for(settled, f"{arguments.count} requests answered and every partition's lag 0", 120)
        # Still: the same numbers twice in a row, one statistics interval (5 s) apart.
        def still():
            first = {k: v for k, v in flatten(json.loads(get(f"{base}/status"))).items() if k not in MOVING}
            time.sleep(5.5)
            second = {k: v for k, v in flatten(json.loads(get(f"{base}/status"))).items() if k not in MOVING}
            return first == second

        wait_for(still, "/status holding still", 60)
        driver, errors = open_page(f"{base}/")
        try:
            status = json.loads(get(f"{base}/status"))
            if errors:
                failures.append(f"console errors: {errors}")
            # In one call: the page reloads itself, and elements read one by one could go stale.
            shown = driver.execute_script(
                "const shown = {};"
                "for (const e of document.querySelectorAll('[data-status]')) shown[e.dataset.status] = e.textContent;"
                "return shown;")
            expected = flatten(status)
            for path, value in expected.items():
                if path not in shown:
                    failures.append(f"/status {path} = {value} is not on the page")
                    continue
                if path in MOVING:
                    continue
                text = shown[path]
                if isinstance(value, str):
                    same = text == value
                else:
                    # Equal as shown: to the decimals the page writes (a duration of 0.005057 s is 0.01).
                    decimals = len(text.split(".")[1]) if "." in text else 0
                    same = (re.fullmatch(r"-?[0-9]+(\.[0-9]+)?", text) is not None
                            and abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9)
                if not same:
                    failures.append(f"{path}: the page shows {text!r}, /status says {value!r}")
            for path in shown:
                if path not in expected:
                    failures.append(f"the page shows {path}, which /status does not have")
            page = driver.execute_script("return document.body.innerText")
            for entry in status["last_errors"][:5]:
                if entry["message"][:60] not in page:
                    failures.append(f"last error not shown: {entry['message'][:60]!r}")
            if not status["last_errors"]:
                failures.append("no warning in /status: the invalid records should have logged dead letters")
            if arguments.screenshot:
                # The top of the page, small enough to keep in the repository.
                driver.set_window_size(900, 1000)
                driver.save_screenshot(arguments.screenshot)
            print(f"status page: {len(shown)} numbers shown, each equal to /status; "
                  f"{len(status['partitions'])} partitions, {len(status['dead_letters'])} dead-letter reasons, "
                  f"{len(status['last_errors'])} last warnings; no console errors" if not failures else "")
        finally:
            driver.quit()
    finally:
        for child in reversed(children):
            child.terminate()
            try:
                child.wait(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
        shutil.rmtree(work, ignore_errors=True)
    for failure in failures:
        print(f"status page: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
