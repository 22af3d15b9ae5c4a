#!/usr/bin/env python3
import hashlib
import json
import sys

args = json.load(sys.stdin)
ticket = "BUG-" + hashlib.sha256(args["message"].encode()).hexdigest()[:6].upper()
json.dump({"outcome": f"filed {ticket} ({args['severity']})", "ticket": ticket}, sys.stdout)
