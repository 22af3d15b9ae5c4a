"""A tar header's numbers have 11 octal digits: a wider one is refused, never written shifted."""

from __future__ import annotations

import pytest

from heddle.errors import UsageError
from heddle.format.pack import resolve_source_date_epoch
from heddle.format.tar import BLOCK, MAX_SIZE, header


def test_the_widest_numbers_fit_and_one_more_is_refused() -> None:
    assert len(header("a", MAX_SIZE, 0o644, MAX_SIZE)) == BLOCK
    with pytest.raises(ValueError, match="does not fit a ustar header"):
        header("a", MAX_SIZE + 1, 0o644, 0)
    with pytest.raises(ValueError, match="does not fit a ustar header"):
        header("a", 1, 0o644, MAX_SIZE + 1)


def test_a_source_date_epoch_past_the_header_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(MAX_SIZE))
    assert resolve_source_date_epoch() == MAX_SIZE
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(MAX_SIZE + 1))
    with pytest.raises(UsageError, match=r"SOURCE_DATE_EPOCH='8589934592' is past what a tar header holds"):
        resolve_source_date_epoch()
