"""A node type for heddle flows: `component_type: TextStats`."""

import math
import re

from heddle.plugin import Plugin

plugin = Plugin()


@plugin.node("TextStats")
def text_stats(call):
    text = call.input["text"]
    words = len(text.split())
    sentences = len([s for s in re.split(r"[.!?]+", text) if s.strip()])
    seconds = math.ceil(words * 60 / call.config["words_per_minute"])
    long_after = call.node["properties"].get("long_after", 50)
    branch = "long" if words > long_after else "short"
    return {"words": words, "sentences": sentences, "reading_seconds": seconds}, branch


if __name__ == "__main__":
    plugin.serve()
