"""docs/agentspec.md's table of component types says what the code does: the types heddle's reader
knows run, every other type the specification defines is refused with its reason."""

from __future__ import annotations

import re
from pathlib import Path

from heddle.agentspec import catalog
from heddle.agentspec.components import KNOWN_COMPONENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "agentspec.md"
_TABLE = re.compile(r"<!-- component table: [^>]*-->\n(.*?)<!-- end of component table -->", re.DOTALL)


def test_the_catalogue_covers_every_type_the_reader_knows() -> None:
    # A type the reader learns must be placed in the table, and loses its reason for being refused.
    assert set(KNOWN_COMPONENT_TYPES) <= set(catalog.BY_TYPE), set(KNOWN_COMPONENT_TYPES) - set(catalog.BY_TYPE)
    for entry in catalog.ENTRIES:
        if entry.refusal is None:
            assert entry.component_type in KNOWN_COMPONENT_TYPES, f"{entry.component_type} needs a refusal"
        elif not entry.refusal.even_if_read:
            assert entry.component_type not in KNOWN_COMPONENT_TYPES, f"{entry.component_type} runs: drop its refusal"
        state = catalog.status(entry.component_type)
        assert (state == "runs") == (catalog.refusal(entry.component_type) is None), entry.component_type
        assert state == "refused" or entry.component_type in KNOWN_COMPONENT_TYPES


def test_the_table_in_docs_is_the_catalogue() -> None:
    found = _TABLE.search(DOC.read_text(encoding="utf-8"))
    assert found is not None, f"{DOC} has lost its component table markers"
    expected = catalog.markdown_table()
    assert found.group(1) == expected, (
        "docs/agentspec.md's component table is out of date; replace it with the output of "
        "`python -m heddle.agentspec.catalog`:\n" + expected)
