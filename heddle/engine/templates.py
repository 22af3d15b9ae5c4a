"""`{{name}}` placeholders: strings go in verbatim, other values as compact JSON.

Unknown placeholders are left exactly as written, so a prompt that talks about templates is not
mangled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}\s]+)\s*\}\}")


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def render(template: str, values: Mapping[str, Any]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        return as_text(values[name]) if name in values else match.group(0)

    return _PLACEHOLDER.sub(substitute, template)
