#!/usr/bin/env python3
import json
import sys

message = json.load(sys.stdin)["message"]
json.dump({"outcome": f"archived: {message[:40]}"}, sys.stdout)
