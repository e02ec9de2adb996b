#!/usr/bin/env python3
"""The processor hands freed memory back under both allocators it runs with: glibc's malloc
(`malloc_trim`) and jemalloc, which the Docker image preloads (its arenas purged through
`mallctl`; glibc's trim would find nothing there). Runs `bench --no-kafka` under each and checks
which allocator answered the memory return the processor makes every 10 s.

    scripts/check_allocator.py .build/debug/encore-processor
"""
import glob
import json
import os
import subprocess
import sys


def require(condition, message):
    if not condition:
        sys.exit(f"allocator check: {message}")


def run(binary, preload):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([binary, "bench", "--no-kafka", "--count", "20000", "--json"], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    binary = sys.argv[1]
    plain = run(binary, None)
    require(plain["allocator"] == "glibc", f"without a preload the memory return should reach glibc: {plain}")
    jemalloc = sorted(glob.glob("/usr/lib/*-linux-gnu/libjemalloc.so.2"))
    if not jemalloc:
        sys.exit("allocator check: libjemalloc2 is not installed (scripts/install-deps.sh installs it)")
    preloaded = run(binary, jemalloc[0])
    require(preloaded["allocator"] == "jemalloc",
            f"under jemalloc the memory return should purge its arenas: {preloaded}")
    print(f"allocator: freed memory returned under glibc ({plain['rss_mb']:.1f} -> "
          f"{plain['rss_after_memory_return_mb']:.1f} MB) and jemalloc ({preloaded['rss_mb']:.1f} -> "
          f"{preloaded['rss_after_memory_return_mb']:.1f} MB)")


if __name__ == "__main__":
    main()
