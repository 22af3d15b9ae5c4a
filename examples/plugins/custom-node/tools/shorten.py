#!/usr/bin/env python3
import json
import sys

args = json.load(sys.stdin)
words = args["text"].split()
json.dump({"summary": " ".join(words[: args.get("keep", 8)]) + " ..."}, sys.stdout)
