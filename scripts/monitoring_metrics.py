#!/usr/bin/env python3
"""The monitoring files' metric names and structure, for scripts/check_monitoring.sh.

Usage:
  monitoring_metrics.py names FILE...                 metric names the expressions use, one a line
  monitoring_metrics.py check-tests RULES TESTS       every alert has a test that fires and one that does not
  monitoring_metrics.py check-dashboard --datasources YML [--compose FILE] DASHBOARD...
  monitoring_metrics.py dashboard-rules DASHBOARD...   the dashboards' expressions as a rule file (promtool)
  monitoring_metrics.py wait-scraped URL JOB SECONDS  until Prometheus has scraped JOB's targets, up
  monitoring_metrics.py wait-names URL SECONDS FILE...
      until Prometheus knows every metric name the files use, and its rules evaluated without error

FILE is a Prometheus rule file (YAML) or a Grafana dashboard (JSON). Names come from the
expressions themselves (rules' `expr`, panels' targets, `label_values(...)` of the templating).
Exits non-zero, saying what is wrong, on any failure.
"""
import json
import re
import sys
import time
import urllib.parse
import urllib.request

import yaml

KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
            "offset", "inf", "nan"}


def metric_names(expr):
    """The metric names a PromQL expression selects (not functions, keywords or label names)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)  # strings
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[a-zA-Z_:][\w:]*", text):
        name = match.group(0)
        # A function or aggregation: followed by its arguments, or by its grouping first.
        if name.lower() in KEYWORDS or re.match(r"\s*(\(|(by|without)\b)", text[match.end():]):
            continue
        names.add(name)
    return names


def rule_expressions(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    recorded = set()
    exprs = []
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            exprs.append(str(rule["expr"]))
            if "record" in rule:
                recorded.add(rule["record"])
    return exprs, recorded


def dashboard_panels(dashboard):
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # collapsed rows


def dashboard_expressions(path):
    with open(path) as f:
        dashboard = json.load(f)
    exprs = [t["expr"] for p in dashboard_panels(dashboard) for t in p.get("targets", []) if t.get("expr")]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        query = query.get("query", "") if isinstance(query, dict) else str(query or "")
        match = re.match(r"\s*label_values\((.*),\s*\w+\s*\)\s*$", query) or re.match(
            r"\s*query_result\((.*)\)\s*$", query)
        if match:
            exprs.append(match.group(1))
    return exprs


def names_in(paths):
    names, recorded = set(), set()
    for path in paths:
        if path.endswith(".json"):
            exprs = dashboard_expressions(path)
        else:
            exprs, defined = rule_expressions(path)
            recorded |= defined
        for expr in exprs:
            names |= metric_names(expr)
    return sorted(names - recorded)


def check_tests(rules_path, tests_path):
    with open(rules_path) as f:
        alerts = [r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"] if "alert" in r]
    with open(tests_path) as f:
        tests = yaml.safe_load(f).get("tests", [])
    fires, silent = set(), set()
    for test in tests:
        for case in test.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    errors = [f"{a}: no test where it fires" for a in alerts if a not in fires]
    errors += [f"{a}: no test where it must not fire (exp_alerts: [])" for a in alerts if a not in silent]
    errors += [f"{a}: tested, but no such alert in {rules_path}" for a in sorted((fires | silent) - set(alerts))]
    return errors, f"{len(alerts)} alerts, each tested firing and not firing"


def check_dashboard(paths, datasources_path, compose_path):
    with open(datasources_path) as f:
        provisioned = yaml.safe_load(f)
    sources = [d for d in provisioned.get("datasources", []) if d.get("type") == "prometheus"]
    errors = [] if len(sources) == 1 and sources[0].get("uid") else [
        f"{datasources_path}: expected one prometheus datasource with a uid"]
    uid = sources[0].get("uid") if sources else None

    def check_source(where, source):
        if not isinstance(source, dict) or source.get("uid") != uid or source.get("type", "prometheus") != "prometheus":
            errors.append(f"{where}: datasource {source!r} is not the provisioned {{type: prometheus, uid: {uid}}}")

    panels_seen = 0
    for path in paths:
        with open(path) as f:
            dashboard = json.load(f)
        for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list)):
            if not isinstance(dashboard.get(key), kind):
                errors.append(f"{path}: `{key}` missing or not a {kind.__name__}")
        ids = [p.get("id") for p in dashboard_panels(dashboard)]
        if len(ids) != len(set(ids)) or not all(isinstance(i, int) for i in ids):
            errors.append(f"{path}: panel ids must be distinct integers: {ids}")
        for panel in dashboard_panels(dashboard):
            where = f"{path}: panel {panel.get('title')!r}"
            if panel.get("type") == "row":
                continue
            panels_seen += 1
            if not panel.get("title") or not panel.get("type"):
                errors.append(f"{where}: needs a title and a type")
            grid = panel.get("gridPos", {})
            if not all(isinstance(grid.get(k), int) for k in "hwxy") or grid.get("x", 0) + grid.get("w", 0) > 24:
                errors.append(f"{where}: gridPos needs integer h, w, x, y within 24 columns: {grid}")
            check_source(where, panel.get("datasource"))
            targets = panel.get("targets") or []
            if not targets:
                errors.append(f"{where}: no targets")
            ref_ids = [t.get("refId") for t in targets]
            if len(ref_ids) != len(set(ref_ids)) or not all(ref_ids):
                errors.append(f"{where}: targets need distinct refIds: {ref_ids}")
            for target in targets:
                if not str(target.get("expr", "")).strip():
                    errors.append(f"{where}: target {target.get('refId')} has no expr")
                if "datasource" in target:
                    check_source(f"{where} target {target.get('refId')}", target["datasource"])
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") == "query":
                check_source(f"{path}: variable {variable.get('name')!r}", variable.get("datasource"))
    if compose_path:
        errors += check_compose(compose_path)
    return errors, f"{panels_seen} panels, every target an expr on datasource {uid}"


def check_compose(path):
    """Grafana in the monitoring profile mounts the provisioning and the dashboards read-only."""
    with open(path) as f:
        services = yaml.safe_load(f).get("services", {})
    grafana = [s for s in services.values() if str(s.get("image", "")).startswith("grafana/grafana:")]
    if len(grafana) != 1 or "monitoring" not in grafana[0].get("profiles", []):
        return [f"{path}: expected one grafana/grafana:<version> service in the monitoring profile"]
    mounts = {v.split(":")[0]: v.split(":")[1:] for v in grafana[0].get("volumes", []) if isinstance(v, str)}
    errors = []
    for source in ("./deploy/grafana/provisioning", "./deploy/grafana/dashboards"):
        if mounts.get(source, [None, None])[-1] != "ro":
            errors.append(f"{path}: grafana must mount {source} read-only")
    with open("deploy/grafana/provisioning/dashboards/encore.yml") as f:
        wanted = {p["options"]["path"] for p in yaml.safe_load(f)["providers"]}
    if wanted - {m[0] for m in mounts.values() if m}:
        errors.append(f"{path}: grafana mounts no dashboards at {sorted(wanted)}")
    return errors


def dashboard_rules(paths):
    """A rule file of every dashboard expression, Grafana's variables replaced, for `promtool check rules`."""
    rules = []
    for path in paths:
        for i, expr in enumerate(dashboard_expressions(path)):
            expr = expr.replace("$__rate_interval", "1m").replace("$__interval", "1m").replace("$__range", "1h")
            expr = re.sub(r"\$\{?\w+\}?", ".*", expr)
            rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    return yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False)


def api(url, path, **query):
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(query)}", timeout=5) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"{path}: {body}")
    return body["data"]


def poll(seconds, attempt):
    """Calls attempt() every half second until it returns (done, message) with done, or the deadline."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            done, message = attempt()
        except OSError as error:  # not listening yet
            done, message = False, str(error)
        if done or time.monotonic() > deadline:
            return done, message
        time.sleep(0.5)


def wait_scraped(url, job, seconds):
    def attempt():
        targets = [t for t in api(url, "/api/v1/targets")["activeTargets"] if t["labels"].get("job") == job]
        scraped = [t for t in targets if t["health"] == "up" and not t["lastScrape"].startswith("0001")]
        return bool(targets) and len(scraped) == len(targets), f"targets of {job}: {targets}"
    done, message = poll(seconds, attempt)
    return ([] if done else [f"not scraped within {seconds} s: {message}"]), f"{job} is up and scraped"


def wait_names(url, seconds, paths):
    wanted = set(names_in(paths))

    def attempt():
        missing = wanted - set(api(url, "/api/v1/label/__name__/values"))
        rules = [r for g in api(url, "/api/v1/rules")["groups"] for r in g["rules"]]
        unhealthy = [f"{r['name']}: {r.get('health')} {r.get('lastError', '')}" for r in rules
                     if r.get("health") != "ok"]
        return not missing and not unhealthy and bool(rules), (
            f"metric names not in Prometheus: {sorted(missing)}; rules not evaluated ok: {unhealthy or 'none'}")
    done, message = poll(seconds, attempt)
    return ([] if done else [f"after {seconds} s: {message}"]), (
        f"all {len(wanted)} metric names the files use are in Prometheus; its rules evaluate ok")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[1], argv[2:]
    if command == "names":
        print("\n".join(names_in(args)))
        return 0
    if command == "dashboard-rules":
        print(dashboard_rules(args), end="")
        return 0
    if command == "check-tests":
        errors, ok = check_tests(*args)
    elif command == "check-dashboard":
        options = {"--datasources": None, "--compose": None}
        while args and args[0] in options:
            options[args[0]], args = args[1], args[2:]
        errors, ok = check_dashboard(args, options["--datasources"], options["--compose"])
    elif command == "wait-scraped":
        errors, ok = wait_scraped(args[0], args[1], float(args[2]))
    elif command == "wait-names":
        errors, ok = wait_names(args[0], float(args[1]), args[2:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for error in errors:
        print(f"FAIL {error}")
    if not errors:
        print(f"ok: {ok}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
