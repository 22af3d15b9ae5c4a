#!/usr/bin/env python3
"""Return the SKILL.md of one skill."""
import json
import os
import sys

name = json.load(sys.stdin)["name"]
if "/" in name or name.startswith("."):
    sys.exit(f"read_skill: {name!r} is not a skill name")
path = os.path.join("skills", name, "SKILL.md")
if not os.path.isfile(path):
    sys.exit(f"read_skill: no skill named {name!r}")
with open(path, encoding="utf-8") as fh:
    json.dump({"text": fh.read()}, sys.stdout, ensure_ascii=False)
