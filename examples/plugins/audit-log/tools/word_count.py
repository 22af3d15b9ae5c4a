#!/usr/bin/env python3
import json
import sys

json.dump({"words": len(json.load(sys.stdin)["title"].split())}, sys.stdout)
