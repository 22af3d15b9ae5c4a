#!/usr/bin/env python3
"""List the skills mounted at ./skills (the workspace is the working directory)."""
import json
import os
import sys

json.load(sys.stdin)
skills = sorted(d for d in os.listdir("skills") if os.path.isfile(os.path.join("skills", d, "SKILL.md")))
json.dump({"skills": skills}, sys.stdout)
