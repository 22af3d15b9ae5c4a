#!/usr/bin/env python3
"""A flaky quote service: it fails until it has been called `fail_first` times, counting its
calls in state/calls (a read-write mount, so the count survives between attempts)."""
import json
import pathlib
import sys

args = json.load(sys.stdin)
counter = pathlib.Path("state/calls")
calls = int(counter.read_text() or 0) if counter.exists() else 0
counter.write_text(str(calls + 1))
if calls < args.get("fail_first", 2):
    sys.stderr.write(f"quote service unavailable (call {calls + 1}), try again\n")
    sys.exit(75)
json.dump({"price": {"ACME": 42, "INITECH": 7}.get(args["symbol"], 0), "calls": calls + 1}, sys.stdout)
