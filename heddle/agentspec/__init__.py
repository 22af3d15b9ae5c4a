"""The Agent Spec document: reading it, resolving references, and its typed model.

`load_flow(path)` is the one entry point most callers need.
"""

from heddle.agentspec.document import load_flow, load_flow_text, parse_flow

__all__ = ["load_flow", "load_flow_text", "parse_flow"]
