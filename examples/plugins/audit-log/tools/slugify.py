#!/usr/bin/env python3
import json
import re
import sys

title = json.load(sys.stdin)["title"]
json.dump({"slug": re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")}, sys.stdout)
