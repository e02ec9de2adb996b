#!/usr/bin/env python3
"""Fetches a Prometheus text page (URL) and prints its samples as JSON, parsed with
prometheus_client's own parser: an independent check of the processor's /metrics.

Usage: parse_metrics.py URL  ->  {"name{label=value,...}": value, ...}
"""
import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
samples = {}
for family in text_string_to_metric_families(text):
    for sample in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
        samples[f"{sample.name}{{{labels}}}"] = sample.value
print(json.dumps(samples))
