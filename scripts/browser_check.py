#!/usr/bin/env python3
"""Opens pages in headless Chromium and checks what a reader sees.

Reusable part: `open_page(url_or_path) -> (driver, console_errors)` opens a URL (http://, file://)
or a local file in the system's Chromium through the system chromedriver (/usr/bin/chromedriver,
no download), waits for the page to load, and returns the driver with the page's console errors
(browser log entries of level SEVERE, as strings). The caller quits the driver. For example:

    from browser_check import open_page
    driver, errors = open_page("http://127.0.0.1:9464/status")
    try:
        assert not errors, errors
        print(driver.find_element(By.TAG_NAME, "h1").text)
    finally:
        driver.quit()

`console_errors(driver)` reads the errors logged since the last read (after a click, say).

Command line:
    browser_check.py open URL_OR_FILE [--screenshot PNG]    print console errors; exit 1 if any
    browser_check.py loadtest REPORT.html REPORT.json [--screenshot PNG]
    browser_check.py audit REPORT.html REPORT.json [--screenshot PNG]

`loadtest` and `audit` check an HTML report of that command against the JSON report of the same
run: no console errors, every chart drawn with data, no two labels of a chart overlapping (as the
browser lays them out), and the totals of the tables, read as rendered text, equal to the JSON's.
Exit status 0 when every check passes, 1 when one fails (each failure on standard error).
"""

import argparse
import json
import os
import re
import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def open_page(url, width=1280, height=1600, timeout_s=30):
    """Opens `url` (or a local file path) in headless Chromium; returns (driver, console_errors)."""
    if "://" not in url:
        url = "file://" + os.path.abspath(url)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(timeout_s)
        driver.get(url)
        deadline = time.monotonic() + timeout_s
        while driver.execute_script("return document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading in {timeout_s} s")
            time.sleep(0.05)
        return driver, console_errors(driver)
    except BaseException:
        driver.quit()
        raise


def console_errors(driver):
    """The console errors (level SEVERE) logged since the last read."""
    return [f"{entry['level']}: {entry['message']}" for entry in driver.get_log("browser")
            if entry["level"] == "SEVERE"]


def save_full_screenshot(driver, path):
    """A PNG of the whole page, not only of the window's height."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, height + 200)
    driver.save_screenshot(path)


class Checks:
    """Collects failures rather than stopping at the first, so one run shows them all."""

    def __init__(self, name):
        self.name = name
        self.failures = []

    def expect(self, condition, message):
        if not condition:
            self.failures.append(message)
        return condition

    def equal(self, what, shown, expected):
        return self.expect(shown == expected, f"{what}: the page shows {shown!r}, the JSON report {expected!r}")


# Boxes of every label (text) and legend swatch of each chart, as the browser laid them out.
_LABEL_BOXES = """
return Array.from(document.querySelectorAll('svg')).map(svg => ({
  id: svg.id,
  boxes: Array.from(svg.querySelectorAll('text, rect.swatch')).map(e => {
    const b = e.getBBox();
    return {text: e.tagName === 'text' ? e.textContent : 'swatch', x: b.x, y: b.y, width: b.width, height: b.height};
  }),
}));
"""


def check_labels_apart(driver, checks):
    """No two labels or legend swatches of a chart overlap (more than half a pixel)."""
    for chart in driver.execute_script(_LABEL_BOXES):
        boxes = chart["boxes"]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                overlap_x = min(a["x"] + a["width"], b["x"] + b["width"]) - max(a["x"], b["x"])
                overlap_y = min(a["y"] + a["height"], b["y"] + b["height"]) - max(a["y"], b["y"])
                checks.expect(overlap_x <= 0.5 or overlap_y <= 0.5,
                              f"chart {chart['id']}: {a['text']!r} overlaps {b['text']!r} ({a} / {b})")


def chart(driver, checks, chart_id):
    """The chart's SVG element, or None (a failure) when the page has none."""
    found = driver.find_elements(By.CSS_SELECTOR, f"svg#{chart_id}")
    checks.expect(found and found[0].is_displayed(), f"chart {chart_id}: not on the page")
    return found[0] if found else None


def line_points(svg):
    """Points of each polyline of a line chart, by series name (data-series)."""
    series = {}
    for line in svg.find_elements(By.TAG_NAME, "polyline"):
        points = [tuple(map(float, p.split(","))) for p in (line.get_attribute("points") or "").split()]
        series[line.get_attribute("data-series") or ""] = points
    return series


def table(driver, table_id):
    """The rows of a table as the browser renders them: first cell to the second."""
    rows = driver.find_elements(By.CSS_SELECTOR, f"table#{table_id} tbody tr")
    return {cells[0].text: cells[1].text for cells in (row.find_elements(By.TAG_NAME, "td") for row in rows)
            if len(cells) >= 2}


def counts(text):
    """`cancelled 3, purchased 9` (or `-`/`none`) as a dict."""
    return {} if text in ("-", "none") else {k: int(v) for k, v in (part.rsplit(" ", 1) for part in text.split(", "))}


def check_loadtest(driver, report, checks):
    figures = table(driver, "figures")
    match = re.search(r"\((\d+) requests, ([\d.]+)/s\)", figures.get("offered", ""))
    if checks.expect(match, f"offered: {figures.get('offered')!r} has no '(N requests, R/s)'"):
        checks.equal("offered requests", int(match[1]), report["sent"])
        checks.equal("offered rate", match[2], f"{report['offered']['rate']:.1f}")
    match = re.fullmatch(r"(\d+) of (\d+) valid, ([\d.]+)/s achieved", figures.get("answered", ""))
    if checks.expect(match, f"answered: {figures.get('answered')!r}"):
        checks.equal("answered", int(match[1]), report["answered"])
        checks.equal("valid sent", int(match[2]), report["valid_sent"])
        checks.equal("achieved rate", match[3], f"{report['achieved_rate']:.1f}")
    checks.equal("missing outcomes", figures.get("missing outcomes"), str(report["missing"]))
    checks.equal("duplicate outcomes", figures.get("duplicate outcomes"), str(report["duplicate_outcomes"]))
    checks.equal("dead letters", figures.get("dead letters"), str(report["dead_letters"]))
    checks.equal("results", counts(figures.get("results", "-")), report["results"])
    checks.equal("results total", sum(counts(figures.get("results", "-")).values()), report["answered"])
    latency = report["latency_ms"]
    checks.equal("latency", figures.get("latency"),
                 f"p50 {latency['p50']:.1f} ms, p90 {latency['p90']:.1f} ms, p99 {latency['p99']:.1f} ms, "
                 f"max {latency['max']:.1f} ms")

    windows = report["windows"]
    rate = chart(driver, checks, "rate")
    if rate is not None:
        series = line_points(rate)
        checks.expect(len(series.get("offered", [])) >= 2, f"rate chart: offered line {series.get('offered')}")
        achieved = series.get("achieved", [])
        checks.expect(len(achieved) >= 2, f"rate chart: achieved line {achieved}")
        # The achieved line is drawn over whole windows only: a point at 0 is a window without answers.
        full = [w for w in windows if not w.get("partial")]
        checks.equal("rate chart: points of the achieved line", len(achieved), len(full))
    latency_chart = chart(driver, checks, "latency")
    if latency_chart is not None:
        checks.expect(all(len(p) >= 2 for p in line_points(latency_chart).values()),
                      "latency chart: a percentile line with fewer than 2 points")
    outcomes = chart(driver, checks, "outcomes")
    if outcomes is not None:
        checks.expect(outcomes.find_elements(By.CSS_SELECTOR, "rect:not(.swatch)"), "outcomes chart: no columns")
    offered_rates = {round(w["offered_rate"]) for w in windows if w["sent"] > 0}
    knee = driver.find_elements(By.CSS_SELECTOR, "svg#knee")
    if len(offered_rates) >= 3:
        if checks.expect(knee, f"offered rates {sorted(offered_rates)} but no latency-against-offered-rate chart"):
            checks.expect(all(len(p) >= 3 for p in line_points(knee[0]).values()), "knee chart: too few points")
    else:
        checks.expect(not knee, f"a latency-against-offered-rate chart for offered rates {sorted(offered_rates)}")
        checks.expect("Latency against offered rate is left out" in driver.find_element(By.TAG_NAME, "body").text,
                      "no line saying why latency against offered rate is left out")


def check_audit(driver, report, checks):
    summary = table(driver, "summary")
    names = [name for name, value in report.items() if isinstance(value, int) and name != "discrepancies"]
    for name in names:
        checks.equal(f"summary {name}", summary.get(name), str(report[name]))
    # Every count but invalid_requests (a figure: the producer's mistake) is a discrepancy.
    checks.equal("summary total", sum(int(summary.get(name, "0")) for name in names if name != "invalid_requests"),
                 report["discrepancies"])
    figures = table(driver, "figures")
    json_figures = report["figures"]
    checks.equal("requests", figures.get("requests"), str(json_figures["requests"]))
    checks.equal("outcomes", figures.get("outcomes"), str(json_figures["outcomes"]))
    for row, name in (("outcomes by result", "outcomes_by_result"), ("outcomes by controller", "outcomes_by_controller"),
                      ("dead letters by stage", "dead_letters_by_stage"),
                      ("load-test requests by run", "load_test_requests_by_run")):
        checks.equal(row, counts(figures.get(row, "-")), json_figures[name])
    checks.equal("outcomes by result, total", sum(counts(figures.get("outcomes by result", "-")).values()),
                 json_figures["outcomes"])
    latency = json_figures["latency_ms"]
    checks.equal("latency", figures.get("latency p50 / p90 / p99 / max"),
                 f"{latency['p50']} / {latency['p90']} / {latency['p99']} / {latency['max']} ms")
    for chart_id, name in (("outcomes-per-minute", None), ("latency-histogram", None),
                           ("dead-letters-by-class", "dead_letters_by_class"), ("changes-by-kind", "changes_by_kind")):
        svg = chart(driver, checks, chart_id)
        if svg is None:
            continue
        bars = [r for r in svg.find_elements(By.CSS_SELECTOR, "rect:not(.swatch)")
                if float(r.get_attribute("width")) > 0 and float(r.get_attribute("height")) > 0]
        checks.expect(bars, f"chart {chart_id}: nothing drawn")
        if name:
            # A bar chart labels each bar with its value: together, the JSON's total.
            values = [int(t.text) for t in svg.find_elements(By.CSS_SELECTOR, "text.value")]
            checks.equal(f"chart {chart_id}: sum of the bars", sum(values), sum(json_figures[name].values()))


def check_report(kind, html, json_path, screenshot=None):
    checks = Checks(kind)
    with open(json_path) as file:
        report = json.load(file)
    driver, errors = open_page(html)
    try:
        checks.expect(not errors, f"console errors: {errors}")
        (check_loadtest if kind == "loadtest" else check_audit)(driver, report, checks)
        check_labels_apart(driver, checks)
        if screenshot:
            save_full_screenshot(driver, screenshot)
        checks.failures += console_errors(driver)
    finally:
        driver.quit()
    return checks


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    page = commands.add_parser("open", help="open a URL or file and print its console errors")
    page.add_argument("url")
    page.add_argument("--screenshot")
    for kind in ("loadtest", "audit"):
        command = commands.add_parser(kind, help=f"check an `{kind}` HTML report against its JSON report")
        command.add_argument("html")
        command.add_argument("json")
        command.add_argument("--screenshot")
    arguments = parser.parse_args()
    if arguments.command == "open":
        driver, errors = open_page(arguments.url)
        try:
            if arguments.screenshot:
                save_full_screenshot(driver, arguments.screenshot)
        finally:
            driver.quit()
        for error in errors:
            print(error)
        return 1 if errors else 0
    checks = check_report(arguments.command, arguments.html, arguments.json, arguments.screenshot)
    for failure in checks.failures:
        print(f"{arguments.command} report: {failure}", file=sys.stderr)
    print(f"{arguments.command} report: {'OK' if not checks.failures else f'{len(checks.failures)} failures'}")
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
