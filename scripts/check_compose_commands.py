#!/usr/bin/env python3
"""Checks that every encore-processor command line in docker-compose.yml parses.

Usage: check_compose_commands.py BINARY docker-compose.yml
Each service built from this repository has its `command` run with `--check` appended;
`${VAR:-default}` is replaced by its default. Exits non-zero naming the first failing service.
"""
import re
import subprocess
import sys

import yaml


def interpolate(text):
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", str(text))


def main(binary, path):
    with open(path) as f:
        compose = yaml.safe_load(f)
    checked = 0
    for name, service in compose.get("services", {}).items():
        if not str(service.get("image", "")).startswith("encore-processor"):
            continue
        command = service.get("command")
        if not isinstance(command, list):
            print(f"{name}: command must be a list of arguments")
            return 1
        argv = [binary] + [interpolate(a) for a in command] + ["--check"]
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            print(f"{name}: {' '.join(argv)}\n{result.stderr}")
            return 1
        checked += 1
        print(f"{name}: ok ({' '.join(command[:2])} ...)")
    if checked == 0:
        print("no encore-processor services found")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
