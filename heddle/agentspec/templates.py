"""`{{name}}` placeholders: strings go in verbatim, other values as compact JSON.

A placeholder is a name of word characters between double braces, spaces allowed inside
(`{{x}}`, `{{ x }}`), as the Agent Spec reference infers inputs from them; anything else between
braces (`{{ a.b }}`, `{{#each}}`) is text. Each placeholder of a node is one of its inputs, so the
checks before a run refuse a placeholder that nothing fills; `render` itself leaves an unknown
one as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def placeholders(template: str) -> list[str]:
    """The placeholder names of `template`, each once, in order of first appearance."""
    return list(dict.fromkeys(match.group(1) for match in PLACEHOLDER.finditer(template)))


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render(template: str, values: Mapping[str, Any]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        return as_text(values[name]) if name in values else match.group(0)

    return PLACEHOLDER.sub(substitute, template)
