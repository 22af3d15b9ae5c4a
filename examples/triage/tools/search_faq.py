#!/usr/bin/env python3
import json
import sys

FAQ = {
    "bundle": "A bundle is one signed .heddle file holding a flow, its tools and its files.",
    "trust": "heddle runs a bundle only when a key you trust signed it: heddle trust add KEY.pub.",
}
word = json.load(sys.stdin)["word"].lower()
json.dump({"hits": [text for key, text in FAQ.items() if key in word or word in key]}, sys.stdout)
