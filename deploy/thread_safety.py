#!/usr/bin/env python3
"""Checks the lock annotations (clang's -Wthread-safety, as errors) of every library and server
translation unit, compiling each for syntax only with the flags a build tree recorded in its
compile_commands.json. The tests and benchmarks hold no annotated locks and are left out.

    deploy/thread_safety.py [BUILD_DIR]     # build/release by default; its protos must be built

Exits 0 when every unit passes, 1 naming the units that do not (with clang's messages), 2 when
the build tree or clang is missing.
"""
import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CLANG = "/usr/bin/clang++-14"
SOURCE_DIRS = ("common/", "kernels/", "services/")
CHECK = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
         "-Wno-unknown-warning-option"]


def clang_arguments(entry):
    """The entry's compiler flags for clang: launcher, compiler, output and source dropped."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    while args and os.path.basename(args[0]) in ("ccache", "sccache"):
        args = args[1:]
    out, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
        elif a in ("-c", entry["file"]):
            continue
        else:
            out.append(a)
    return [CLANG] + out + CHECK + [entry["file"]]


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build/release"))
    database = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(database):
        print(f"thread_safety: no {database} (configure and build that tree first)", file=sys.stderr)
        return 2
    if not os.access(CLANG, os.X_OK):
        print(f"thread_safety: no {CLANG} (run deploy/setup.sh)", file=sys.stderr)
        return 2
    with open(database) as f:
        entries = json.load(f)
    units, seen = [], set()
    for e in entries:
        rel = os.path.relpath(e["file"], root)
        if rel.endswith(".cc") and rel.startswith(SOURCE_DIRS) and rel not in seen:
            seen.add(rel)
            units.append((rel, e))
    if not units:
        print(f"thread_safety: {database} names no library or server source", file=sys.stderr)
        return 2

    def check(unit):
        rel, e = unit
        r = subprocess.run(clang_arguments(e), cwd=e["directory"], capture_output=True, text=True)
        return rel, r.returncode, r.stderr

    failed, done = [], 0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for rel, rc, err in pool.map(check, units):
            done += 1
            print(f"[thread-safety {done:3d}/{len(units)}] {rel}{'' if rc == 0 else ': FAILED'}",
                  flush=True)
            if rc != 0:
                failed.append((rel, err))
    for rel, err in failed:
        print(f"--- {rel}\n{err}", file=sys.stderr)
    if failed:
        print(f"thread_safety: {len(failed)} of {len(units)} units fail the check "
              "(clang's messages above)", file=sys.stderr)
        return 1
    print(f"thread_safety: {len(units)} units pass -Wthread-safety")
    return 0


if __name__ == "__main__":
    sys.exit(main())
