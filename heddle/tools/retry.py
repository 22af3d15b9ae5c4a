"""A document's `retry_policy` on an MCPTool or MCPToolBox, applied as the reference runtime (WayFlow
26.3.1) applies it, to two things separately:

- finding the tool: while a tool a toolbox's `tool_filter` names is missing from the server's
  listing, the listing is asked for again; a toolbox without a `tool_filter` is listed once. Any
  other failure of the listing is not retried. (WayFlow calls a document's MCPTool without listing;
  heddle lists it to compare schemas, and re-lists under its policy as for a toolbox.)
- each call: a call that fails with an error naming the tool as missing ("unknown tool", "tool ...
  not found"), with an HTTP status the policy deems recoverable (404 always; 409 and 429 by
  default, or those of `recoverable_statuses`, where their listed codes appear in the error; any
  other 5xx but 501 while `service_error_retry_on_any_5xx`; never 400, 401, 403, 422), or with a
  network failure before any answer (not a TLS one), is made again. A tool's own error answer
  (`isError`) is its result, not retried.

There are `max_attempts + 1` attempts in all. Before retry n (0 for the first) heddle waits
`min(initial_retry_delay * backoff_factor ** n, max_retry_delay)`, with the policy's `jitter`; all
attempts share a budget of `TOTAL_BUDGET_S`, each wait cut to what is left of it. `request_timeout`
bounds no MCP call in the reference runtime, nor in heddle (the run's --tool-timeout bounds each
call, retries included).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from heddle.agentspec.components import RetryPolicy

T = TypeVar("T")

TOTAL_BUDGET_S = 600.0  # the reference runtime's budget for all the attempts of one operation
_RNG = random.SystemRandom()
_NEVER = frozenset({400, 401, 403, 422, 501})


class BudgetSpent(Exception):
    """The retries' time budget is spent."""


def wait_before(policy: RetryPolicy, retry: int, status: int | None, rng: random.Random = _RNG) -> float:
    """Seconds to wait before retry `retry` (0 for the first) after a failure with `status`."""
    base = min(policy.initial_retry_delay * policy.backoff_factor ** retry, policy.max_retry_delay)
    jitter = policy.jitter
    if jitter is None:
        return base
    if jitter == "equal" or (jitter == "full_and_equal_for_throttle" and status is not None and 400 <= status < 500):
        return base / 2 + rng.random() * base / 2
    if jitter in ("full", "full_and_equal_for_throttle"):
        return rng.random() * base
    return min(base + rng.random(), policy.max_retry_delay)  # decorrelated


def recoverable_status(policy: RetryPolicy, status: int, text: str) -> bool:
    if status in _NEVER:
        return False
    codes = policy.recoverable_statuses.get(str(status))
    if codes is not None:
        return not codes or any(code.lower() in text.lower() for code in codes)
    return policy.service_error_retry_on_any_5xx and 500 <= status < 600


def _chain(exc: BaseException) -> Iterator[BaseException]:
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__context__, current.__cause__) if e is not None)


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", getattr(exc, "status", None))
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    try:
        return int(status) if status is not None else None
    except (TypeError, ValueError):
        return None


def tls_failure(exc: BaseException) -> bool:
    """A failure of the server's certificate, which no retry mends (the reference runtime's reading)."""
    import ssl

    return any(isinstance(e, ssl.SSLCertVerificationError) or any(
        s in str(e) for s in ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "hostname",
                              "self signed certificate")) for e in _chain(exc))


def missing_tool(exc: BaseException) -> bool:
    """An MCP error saying the tool is not there (yet)."""
    from mcp.shared.exceptions import MCPError

    if not isinstance(exc, MCPError):
        return False
    message = exc.message.lower()
    return "tool" in message and ("not found" in message or "unknown" in message or "does not exist" in message)


def call_retry(policy: RetryPolicy, exc: BaseException) -> tuple[bool, int | None]:
    """Whether a failed call is made again, and the HTTP status it failed with (for the jitter)."""
    import httpx2

    for current in _chain(exc):
        if isinstance(current, httpx2.TransportError):
            return not tls_failure(current), None
        status = _status(current)
        if status is not None:
            text = str(getattr(current, "body", None) or getattr(current, "message", None) or current)
            return recoverable_status(policy, status, text), status
    for current in _chain(exc):
        if _status(current) == 404:
            return True, 404
        if missing_tool(current):
            return True, None
    return False, None


async def with_retries(policy: RetryPolicy | None, attempt: Callable[[], Awaitable[T]],
                       retried: Callable[[BaseException], tuple[bool, int | None]]) -> T:
    """`attempt()`, made again as `policy` says while `retried(error)` says so."""
    if policy is None:
        return await attempt()
    loop = asyncio.get_running_loop()
    started = loop.time()
    for retry in range(policy.max_attempts + 1):
        try:
            return await attempt()
        except Exception as exc:
            again, status = retried(exc)
            if not again or retry >= policy.max_attempts:
                raise
            left = TOTAL_BUDGET_S - (loop.time() - started)
            if left <= 0:
                raise BudgetSpent(f"its retry_policy's {TOTAL_BUDGET_S:g} s for all attempts are spent") from exc
            await asyncio.sleep(min(wait_before(policy, retry, status), left))
    raise AssertionError("unreachable")
