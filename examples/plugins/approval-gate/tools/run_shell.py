#!/usr/bin/env python3
"""Pretends to run a shell command and reports what it would have done. (A real one would run
it; this example never does, whatever the gate decides.)"""
import json
import sys

command = json.load(sys.stdin)["command"]
listing = {"ls": "notes.txt\nbuild/\n", "du -sh build": "120M\tbuild\n"}
json.dump({"command": command, "stdout": listing.get(command, ""), "exit": 0}, sys.stdout)
