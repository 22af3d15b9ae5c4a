"""The chat-completions client the engine calls: one request per assistant turn.

`POST {base}/chat/completions`, streamed (server-sent events) by default or buffered.
Connection failures, 429 and 5xx are retried with exponential backoff; anything else,
or the last failure, becomes a `ModelError` quoting the status and the start of the body.
An llm config's `retry_policy` replaces that rule for its requests, as the reference runtime
(WayFlow 26.3.1) applies it: its attempts, its waits, the statuses it deems recoverable, any
network failure before an answer (a timeout too, but not a TLS failure) and its `request_timeout`.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

import httpx

from heddle.bounded import ACCEPT_ENCODING, Body, BodyError, read_body, size_text
from heddle.engine.options import RunOptions
from heddle.errors import ModelError, ModelOverrun, UsageError
from heddle.lazytls import LazyTLSTransport
from heddle.model.endpoints import ModelEndpoint, endpoint_url, resolve_api_key
from heddle.model.sse import event_data, lines
from heddle.model.turn import AssistantTurn, ToolCall, TurnAssembler, turn_from_completion
from heddle.safeparse import loads_json
from heddle.tools.retry import TOTAL_BUDGET_S, recoverable_status, tls_failure, wait_before

if TYPE_CHECKING:
    from heddle.agentspec.components import RetryPolicy

__all__ = [
    "AssistantTurn",
    "ModelClient",
    "ModelEndpoint",
    "ToolCall",
    "endpoint_url",
    "resolve_api_key",
]

_BODY_EXCERPT = 300
_MAX_RETRY_AFTER_S = 30.0

_HINTS = {
    401: "; check the llm config's api_key",
    403: "; check the llm config's api_key",
    404: "; check the llm config's url and model_id",
}

# Failures where the request can safely be sent again: nothing, or nothing usable, came back.
_RETRYABLE_TRANSPORT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadError, httpx.WriteError,
                        httpx.RemoteProtocolError)


class _Retryable(Exception):
    """One attempt failed in a way another attempt may not."""

    def __init__(self, what: str, detail: str, retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(what)
        self.what = what  # "HTTP 503", "cannot connect"
        self.detail = detail  # the start of the body, or the network error
        self.retry_after = retry_after
        self.status = status  # of an HTTP answer; None for a network failure


def _excerpt(data: bytes) -> str:
    text = " ".join(data.decode("utf-8", "replace").split())
    return text if len(text) <= _BODY_EXCERPT else text[:_BODY_EXCERPT] + "…"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        seconds = (when - datetime.datetime.now(datetime.UTC)).total_seconds()
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S)


async def _read_start(response: httpx.Response, limit: int = 4096) -> bytes:
    # An error page can be large, endless or a compressed bomb; the message only quotes its start.
    data = bytearray()
    try:
        async for chunk in Body(response, what="", cap=limit, cap_text="").chunks():
            data += chunk
    except BodyError:
        pass
    return bytes(data[:limit])


class ModelClient:
    """One per run. Owns one HTTP connection pool; use `async with` or call `aclose()`."""

    def __init__(self, *, stream: bool = True, timeout: float = 120.0, retries: int = 3, backoff: float = 0.5,
                 transport: httpx.AsyncBaseTransport | None = None, deadline: float | None = None,
                 max_bytes: int | None = None) -> None:
        self.stream = stream
        self.retries = max(0, retries)
        self.backoff = backoff
        self.timeout = timeout  # silence: connecting, or between two reads
        self.deadline = deadline  # one attempt, its whole answer read
        self.max_bytes = RunOptions.max_response_bytes if max_bytes is None else max_bytes  # one answer, decoded
        if transport is None:
            # A model at http://127.0.0.1 never needs the certificate store loaded (heddle.lazytls).
            transport = LazyTLSTransport()
        self._http = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(timeout, connect=min(timeout, 15.0)))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def request_body(self, endpoint: ModelEndpoint, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None = None,
                     response_format: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = dict(endpoint.params)
        body.update(model=endpoint.model_id, messages=messages, stream=self.stream)
        if tools:
            body["tools"] = tools
        else:
            body.pop("tools", None)
        if response_format is not None:
            body["response_format"] = response_format
        return body

    async def chat(self, endpoint: ModelEndpoint, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None = None,
                   on_delta: Callable[[str], None] | None = None,
                   response_format: dict[str, Any] | None = None) -> AssistantTurn:
        """Ask for one assistant turn. `on_delta` sees content as it arrives (once, whole, when buffered);
        `response_format` (OpenAI's) constrains the answer to a JSON Schema."""
        base = endpoint_url(endpoint.base_url)
        url = base + "/chat/completions"
        where = f"model {endpoint.model_id!r} at {base}"
        try:
            # Encoded once: every retry sends the very same bytes.
            content = json.dumps(self.request_body(endpoint, messages, tools, response_format), ensure_ascii=False,
                                 separators=(",", ":"), allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{where}: the request cannot be sent as JSON ({exc});"
                             " check default_generation_parameters") from None
        headers = {"content-type": "application/json", "accept-encoding": ACCEPT_ENCODING,
                   "accept": "text/event-stream" if self.stream else "application/json"}
        if endpoint.api_key:
            headers["authorization"] = f"Bearer {endpoint.api_key}"
        policy = endpoint.retry_policy
        retries = self.retries if policy is None else policy.max_attempts
        started = asyncio.get_running_loop().time()
        attempt = 0
        while True:
            assembler = TurnAssembler(on_delta)
            try:
                return await self._attempt(url, content, headers, assembler, where, policy)
            except _Retryable as failure:
                # Content already shown cannot be taken back: an answer broken mid-stream is not asked again.
                delay = None if attempt >= retries or assembler.emitted else self._delay(policy, attempt, failure,
                                                                                          started)
                if delay is None:
                    tries = f" after {attempt + 1} attempts" if attempt else ""
                    detail = f": {failure.detail}" if failure.detail else ""
                    raise ModelError(f"{where}: {failure.what}{tries}{detail}") from None
                attempt += 1
                await asyncio.sleep(delay)

    def _delay(self, policy: RetryPolicy | None, attempt: int, failure: _Retryable, started: float) -> float | None:
        """Seconds to wait before the next attempt; None when a policy's time for all attempts is spent."""
        if policy is None:
            delay = self.backoff * float(2 ** attempt)
            return delay if failure.retry_after is None else max(delay, failure.retry_after)
        # The reference runtime waits what the server's Retry-After says, else the policy's backoff,
        # within one budget for all the attempts.
        delay = failure.retry_after if failure.retry_after is not None else wait_before(policy, attempt,
                                                                                          failure.status)
        left = TOTAL_BUDGET_S - (asyncio.get_running_loop().time() - started)
        return None if left <= 0 else min(delay, left)

    async def _attempt(self, url: str, content: bytes, headers: dict[str, str], assembler: TurnAssembler,
                       where: str, policy: RetryPolicy | None = None) -> AssistantTurn:
        try:
            async with asyncio.timeout(self.deadline):
                return await self._exchange(url, content, headers, assembler, where, policy)
        except BaseException as exc:
            assembler.abandon()
            if not isinstance(exc, TimeoutError):
                raise
            raise ModelOverrun(f"{where}: the answer did not finish within {self.deadline:g} s, the most one model "
                             "request may take") from None

    async def _exchange(self, url: str, content: bytes, headers: dict[str, str], assembler: TurnAssembler,
                        where: str, policy: RetryPolicy | None = None) -> AssistantTurn:
        timeout: Any = httpx.USE_CLIENT_DEFAULT
        if policy is not None and policy.request_timeout is not None:
            # The reference runtime's per-attempt timeout: connecting, and each wait for the server.
            timeout = httpx.Timeout(policy.request_timeout)
        try:
            async with self._http.stream("POST", url, content=content, headers=headers, timeout=timeout) as response:
                status = response.status_code
                if policy is not None and not 200 <= status < 300:
                    start = await _read_start(response)
                    if recoverable_status(policy, status, start.decode("utf-8", "replace")):
                        raise _Retryable(f"HTTP {status}", _excerpt(start), _retry_after(response), status)
                    raise ModelError(f"{where}: HTTP {status}: {_excerpt(start)}{_HINTS.get(status, '')}")
                if status == 429 or status >= 500:
                    raise _Retryable(f"HTTP {status}", _excerpt(await _read_start(response)), _retry_after(response),
                                     status)
                if not 200 <= status < 300:
                    hint = _HINTS.get(status, "")
                    raise ModelError(f"{where}: HTTP {status}: {_excerpt(await _read_start(response))}{hint}")
                if "text/event-stream" in response.headers.get("content-type", ""):
                    return await self._read_stream(response, assembler, where)
                return self._read_buffered(await read_body(response, what=where, cap=self.max_bytes,
                                                           cap_text=self._cap_text()), assembler.on_delta, where)
        except BodyError as exc:
            raise ModelOverrun(exc.message) from None
        except _RETRYABLE_TRANSPORT as exc:
            if policy is not None and tls_failure(exc):
                raise ModelError(_failed(where, exc)) from exc
            raise _Retryable(*_describe(exc)) from exc
        except httpx.TimeoutException as exc:
            if policy is not None:
                limit = policy.request_timeout or self.timeout
                raise _Retryable(f"no answer within {limit:g} s", type(exc).__name__) from exc
            raise ModelOverrun(f"{where}: no answer within {self.timeout:g} s ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            if policy is None or tls_failure(exc):
                raise ModelError(_failed(where, exc)) from exc
            raise _Retryable(*_describe(exc)) from exc
        except httpx.HTTPError as exc:
            raise ModelError(_failed(where, exc)) from exc

    async def _read_stream(self, response: httpx.Response, assembler: TurnAssembler, where: str) -> AssistantTurn:
        done = False
        body = Body(response, what=where, cap=self.max_bytes, cap_text=self._cap_text())
        async for data in event_data(lines(body.chunks())):
            if data.strip() == "[DONE]":
                done = True
                break
            try:
                chunk = loads_json(data)
            except ValueError:
                raise ModelError(f"{where}: stream sent an event that is not JSON: {_excerpt(data.encode())}") from None
            try:
                assembler.feed(chunk)
            except ModelError as exc:
                raise ModelError(f"{where}: {exc.message}") from None
        if not done and assembler.finish_reason is None:
            raise ModelError(f"{where}: the answer stream ended before the answer was complete")
        try:
            return assembler.turn()
        except ModelError as exc:
            raise ModelError(f"{where}: {exc.message}") from None

    def _cap_text(self) -> str:
        return f"{size_text(self.max_bytes)}; raise --max-response-bytes if it needs more"

    def _read_buffered(self, raw: bytes, on_delta: Callable[[str], None] | None, where: str) -> AssistantTurn:
        try:
            obj = loads_json(raw)
        except ValueError:
            raise ModelError(f"{where}: answer is not JSON: {_excerpt(raw)}") from None
        try:
            turn = turn_from_completion(obj)
        except ModelError as exc:
            raise ModelError(f"{where}: {exc.message}") from None
        if turn.content and on_delta is not None:
            on_delta(turn.content)
        return turn


def _failed(where: str, exc: httpx.HTTPError) -> str:
    what, detail = _describe(exc)
    return f"{where}: {what}: {detail}" if detail else f"{where}: {what}"


def _describe(exc: httpx.HTTPError) -> tuple[str, str]:
    kinds: dict[type[httpx.HTTPError], str] = {
        httpx.ConnectError: "cannot connect",
        httpx.ConnectTimeout: "connection timed out",
        httpx.RemoteProtocolError: "the server closed the connection",
        httpx.ReadError: "the connection broke while reading the answer",
        httpx.WriteError: "the connection broke while sending the request",
    }
    kind = kinds.get(type(exc), type(exc).__name__)
    return kind, " ".join(str(exc).split())
