"""Reading a request body: at most the size cap, and it must be one JSON object."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.types import Receive

from heddle.canonical import CanonicalJSONError, Known
from heddle.safeparse import ParseLimitError, loads_strict_json_members
from heddle.server.errors import ApiError, bad_request

# Past the cap the rest of the body is still read (up to this much) and dropped, so the client
# gets the 413 instead of a reset connection while it is still sending.
DISCARD_LIMIT = 8 << 20


class Gone(Exception):
    """The client went away while sending its body; there is no one to answer."""


async def disconnected(receive: Receive) -> None:
    """Returns when the client has closed the connection (its request body already read): what every
    route that runs something watches, so that a caller who leaves stops its run at once."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "body_too_large", f"the request body is over {limit} bytes; send a smaller body "
                                           "(large data belongs in mounts or tools, not in the request)")


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise bad_request(f"Content-Length {declared!r} is not a number") from None
        if length > DISCARD_LIMIT:
            raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    receive, more = request.receive, True  # its messages read here, as Request.stream reads them
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Gone()
        if message["type"] != "http.request":
            continue
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            chunks.clear()
            if size > DISCARD_LIMIT:
                break
            continue
        chunks.append(chunk)
    if size > limit:
        raise _too_large(limit)
    return b"".join(chunks)


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object; an empty body is `{}`."""
    return (await read_json_members(request, limit))[0]


async def read_json_members(request: Request, limit: int, *, known: Known | None = None
                            ) -> tuple[dict[str, Any], dict[str, str]]:
    """`read_json_object`, and each of its members' values as the body writes it: what a request's
    flow is known by (heddle.server.flow_cache); a member whose text is `known` is not read again
    (heddle.canonical.loads_strict_members)."""
    raw = await read_body(request, limit)
    if not raw.strip():
        return {}, {}
    try:
        # No duplicate key, no non-finite number, no lone surrogate (which no file, pipe or tool can carry).
        value, members = loads_strict_json_members(raw, known=known)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8; send JSON text") from None
    except ParseLimitError as exc:
        raise bad_request(f"the request body {exc}; flatten it") from None
    except (ValueError, CanonicalJSONError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad_request(f"the request body must be a JSON object, not {type(value).__name__}")
    return value, members
