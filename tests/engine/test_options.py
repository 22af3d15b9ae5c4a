"""The one rule both shells use for a run's tool-round limit: the flag, else a bundle's proposal,
else the default."""

from __future__ import annotations

import pytest

from heddle.engine.options import DEFAULT_MAX_TOOL_ROUNDS, resolve_max_tool_rounds
from heddle.errors import UsageError


@pytest.mark.parametrize(("given", "proposal", "expected"), [
    (None, None, DEFAULT_MAX_TOOL_ROUNDS),
    (None, "unlimited", None),
    (None, 3, 3),
    ("7", "unlimited", 7),
    ("unlimited", 3, None),
])
def test_the_flag_wins_over_the_proposal_and_unlimited_is_none(given, proposal, expected):
    assert resolve_max_tool_rounds(given, proposal) == expected


def test_a_bad_flag_is_refused_naming_it():
    with pytest.raises(UsageError, match="--max-tool-rounds 'many'"):
        resolve_max_tool_rounds("many", 3)
