#!/usr/bin/env python3
"""Independent validator of the wire contract: checks records against schemas/ with Python's jsonschema.

  validate_events.py examples              every sample in schemas/examples/ gets the expected verdict
                                           (invalid samples must be rejected naming the field in their
                                           file name: <field>--<what is wrong>.json, _record = whole record)
  validate_events.py check EVENT FILE...   every file (or every line of a .jsonl file) is a valid EVENT
  validate_events.py verdicts EVENT FILE... print "<file>\t<valid|invalid>\t<field>" per file

EVENT is a schema name: purchase-request, purchase-outcome, entitlement-change, dead-letter,
entitlement-source, entitlement-state, request-journal.
"""
import json
import pathlib
import re
import sys

from jsonschema import Draft202012Validator

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "schemas"


def validator(event):
    schema = json.loads((SCHEMAS / f"{event}.schema.json").read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def error_fields(v, raw):
    """The set of dotted field paths the validator objects to; {"_record"} when not a JSON object."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"_record"}
    if not isinstance(doc, dict):
        return {"_record"}
    fields = set()
    for error in v.iter_errors(doc):
        path = [str(p) for p in error.absolute_path]
        if error.validator == "required":
            missing = re.match(r"'([^']+)' is a required property", error.message)
            path.append(missing.group(1) if missing else "?")
        fields.add(".".join(path) or "_record")
    return fields


def examples():
    failures = 0
    count = 0
    for event_dir in sorted((SCHEMAS / "examples").iterdir()):
        v = validator(event_dir.name)
        for sample in sorted(event_dir.glob("*/*.json")):
            count += 1
            fields = error_fields(v, sample.read_bytes())
            if sample.parent.name == "valid":
                if fields:
                    failures += 1
                    print(f"FAIL {sample.relative_to(ROOT)}: expected valid, rejected at {sorted(fields)}")
            else:
                expected = sample.stem.split("--")[0]
                if fields != {expected}:
                    failures += 1
                    print(f"FAIL {sample.relative_to(ROOT)}: expected rejection at {expected!r}, got {sorted(fields)}")
    print(f"{count} samples, {failures} disagreements")
    return 1 if failures else 0


def records(path):
    path = pathlib.Path(path)
    raw = path.read_bytes()
    if path.suffix == ".jsonl":
        return [(f"{path}:{n + 1}", line) for n, line in enumerate(raw.splitlines()) if line.strip()]
    return [(str(path), raw)]


def check(event, paths):
    v = validator(event)
    bad = 0
    total = 0
    for path in paths:
        for name, raw in records(path):
            total += 1
            fields = error_fields(v, raw)
            if fields:
                bad += 1
                if bad <= 20:
                    print(f"INVALID {name}: {sorted(fields)}")
    print(f"{total} {event} records, {bad} invalid")
    return 1 if bad or total == 0 else 0


def verdicts(event, paths):
    v = validator(event)
    for path in paths:
        fields = error_fields(v, pathlib.Path(path).read_bytes())
        print(f"{path}\t{'invalid' if fields else 'valid'}\t{','.join(sorted(fields))}")
    return 0


def main(argv):
    if len(argv) >= 1 and argv[0] == "examples":
        return examples()
    if len(argv) >= 3 and argv[0] == "check":
        return check(argv[1], argv[2:])
    if len(argv) >= 3 and argv[0] == "verdicts":
        return verdicts(argv[1], argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
