"""Reading the JSON members of a bundle (manifest, signatures, a format-1 manifest) within the
parse caps, with one outcome for each way they can be wrong: over a cap is BundleLimitError,
not JSON at all is MalformedBundleError (both exit 7)."""

from __future__ import annotations

from typing import Any

from heddle.format.errors import BundleLimitError, MalformedBundleError
from heddle.safeparse import ParseLimitError, loads_json, loads_strict_json


def load_member(data: bytes, *, what: str, **json_options: Any) -> Any:
    """The JSON value of `data`, named `what` in errors. Without `json_options` it is read
    strictly (no duplicate keys, no NaN); with them, by json.loads with those options."""
    try:
        return loads_json(data, **json_options) if json_options else loads_strict_json(data)
    except ParseLimitError as exc:
        raise BundleLimitError(f"{what} {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedBundleError(f"{what} is not valid JSON: {exc}") from None
