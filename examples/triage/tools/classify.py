#!/usr/bin/env python3
import json
import sys

message = json.load(sys.stdin)["message"].lower()
if any(w in message for w in ("crash", "error", "broken", "bug")):
    category = "bug"
elif message.rstrip().endswith("?"):
    category = "question"
else:
    category = "other"
json.dump({"category": category}, sys.stdout)
