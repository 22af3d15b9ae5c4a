"""Traces of a run: OpenTelemetry spans, following the GenAI semantic conventions, sent over OTLP/HTTP.

Tracing is on when the standard variables name a collector (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT`, unless `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`); the
SDK and its exporter (the `heddle[otel]` extra) are imported only then, so a run without them starts
as it always did. The spans are recorded by heddle itself (heddle.engine.spans), the SDK kept for
what is configuration or transport: it reads the other `OTEL_*` variables (headers, timeout,
compression, batching, sampler, span limits, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).

A run's spans come from one layer over its seams (`TracedSeams`), so every way a run starts gets them:

    invoke_agent {flow}       the run of a flow (its root), and one per AgentNode run inside it
    chat {model}              one model call: model, token usage, finish reason
    execute_tool {tool}       one tool call: its kind, outcome and input-schema fingerprint
    heddle.sandbox            a tool's program run in its sandbox (under --safe; without, no sandbox runs)
    heddle.bundle.verify      a bundle opened and verified (heddle.bundle.verified)

Every span carries the bundle's digest and signer key ids (`heddle.bundle.digest`,
`heddle.bundle.signer`) when the run is of a bundle. What a prompt, an answer, a tool's arguments or
its output say is recorded only with `capture_content` (`--otel-capture-content`); error messages,
which may quote them, too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from heddle.engine.journal import Suspended
from heddle.engine.seams import (
    ModelRequest,
    ModelStep,
    NodeStep,
    Outcome,
    ProvidedTool,
    RunSeams,
    SeamsLayer,
    ToolRequest,
    ToolStep,
)
from heddle.errors import UsageError
from heddle.version import __version__

if TYPE_CHECKING:
    import httpx

    from heddle.agentspec import components as c
    from heddle.engine import events as ev
    from heddle.engine.context import RunContext
    from heddle.engine.spans import Recorder
    from heddle.model.turn import AssistantTurn

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# What `pip install` gives the tracer: the extra that carries the SDK and the OTLP/HTTP exporter.
EXTRA = "heddle[otel]"

DIGEST, SIGNER, FINGERPRINT = "heddle.bundle.digest", "heddle.bundle.signer", "heddle.tool.schema_fingerprint"


def endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The collector traces are sent to, as the standard variables name it; None when tracing is off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    for name in ENDPOINT_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value
    return None


def installed() -> bool:
    """Whether the SDK and the OTLP/HTTP exporter can be imported (found, not imported)."""
    from importlib.util import find_spec

    try:
        return all(find_spec(name) is not None for name in ("opentelemetry.sdk",
                                                            "opentelemetry.exporter.otlp.proto.http"))
    except ModuleNotFoundError:  # a parent package missing
        return False


class TracingUnavailable(UsageError):
    """A collector is configured but the SDK is not installed: traces asked for are never silently dropped."""


# One recorder per configuration in a process: its provider's batch processor and exporter are started
# once and flushed when the process exits (the SDK's own exit hook).
_RECORDERS: dict[tuple[tuple[str, str], ...], Recorder] = {}
_MAKING = threading.Lock()
# The environment tracer() saw last, and its answer.
_LAST: tuple[dict[Any, Any] | None, Recorder | None] = (None, None)


def tracer() -> Recorder | None:
    """The process's recorder of spans (heddle.engine.spans) for the configuration the environment
    gives now, or None when tracing is off.

    Raises TracingUnavailable when a collector is named and `heddle[otel]` is not installed."""
    global _LAST
    # A server asks once a request: an environment equal to the one seen last is answered as it was,
    # found by comparing the dict under os.environ (CPython's; some 1 us) rather than decoding and
    # sorting every variable (some 60 us).
    data = getattr(os.environ, "_data", None)
    seen, answer = _LAST
    if data is not None and data == seen:
        return answer
    snapshot = dict(data) if data is not None else None
    found = _configured()
    if snapshot is not None and snapshot == data:  # unchanged meanwhile by another thread
        _LAST = (snapshot, found)
    return found


def _configured() -> Recorder | None:
    if endpoint() is None:
        return None
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("OTEL_")))
    found = _RECORDERS.get(key)
    if found is None:
        with _MAKING:  # a following server's worker thread verifies beside the loop
            found = _RECORDERS.get(key) or _RECORDERS.setdefault(key, _make())
    return found


def _make() -> Recorder:
    if not installed():
        raise TracingUnavailable(f"{'/'.join(ENDPOINT_VARIABLES)} names a collector, but tracing needs the "
                                 f"OpenTelemetry SDK: pip install '{EXTRA}'")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from heddle.engine.otlp import SpanExporter
    from heddle.engine.spans import Recorder

    # The attributes given here win over the variables': the name only when they give none.
    defaults = {"service.version": __version__}
    if not os.environ.get("OTEL_SERVICE_NAME") and "service.name=" not in os.environ.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""):
        defaults["service.name"] = "heddle"
    return Recorder(Resource.create(defaults), BatchSpanProcessor(SpanExporter()))


def flush(timeout_ms: int = 5000) -> None:
    """Send every span ended so far (the SDK sends them in batches)."""
    for recorder in _RECORDERS.values():
        recorder.provider.force_flush(timeout_ms)


def _active() -> bool:
    # Nothing to carry when no tracer was ever made in this process: the API stays unimported.
    return bool(_RECORDERS) and "opentelemetry.trace" in sys.modules


def traceparent() -> str | None:
    """The W3C `traceparent` of the current span, for what a run calls (a tool, a remote API), or None."""
    return _traceparent_of(_api().get_current_span()) if _active() else None


async def send_traceparent(request: httpx.Request) -> None:
    """An httpx request hook: the request carries the current span's `traceparent`."""
    value = traceparent()
    if value is not None:
        request.headers["traceparent"] = value


# The hooks a client of a document's remote tools is made with (RemoteTool, MCP over HTTP).
REQUEST_HOOKS: Mapping[str, list[Any]] = {"request": [send_traceparent]}


@contextlib.contextmanager
def continued(headers: Mapping[str, str]) -> Iterator[None]:
    """Spans started inside are children of the incoming `traceparent` in `headers` (a request's),
    when tracing is on and the header is well-formed; otherwise nothing changes."""
    if "traceparent" not in headers or not _RECORDERS:
        yield
        return
    from opentelemetry import context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    token = context.attach(TraceContextTextMapPropagator().extract(dict(headers)))
    try:
        yield
    finally:
        context.detach(token)


@dataclass(frozen=True)
class Tracing:
    """How one prepared run is traced: the tracer, whether content is recorded, and what every span
    says of the bundle it runs (empty for a document)."""

    tracer: Recorder
    capture_content: bool = False
    bundle: Mapping[str, Any] = field(default_factory=dict)  # heddle.bundle.digest, heddle.bundle.signer
    fingerprints: Mapping[str, str] = field(default_factory=dict)  # tool name -> input-schema fingerprint

    @classmethod
    def configured(cls, *, capture_content: bool = False) -> Tracing | None:
        """The tracing the environment configures for a run, or None when tracing is off."""
        found = tracer()
        return None if found is None else cls(found, capture_content)

    def for_bundle(self, digest: str, signers: list[str], fingerprints: Mapping[str, str]) -> Tracing:
        # The signers a tuple: a plain value, kept as it is (a list is copied into one for every span).
        return Tracing(self.tracer, self.capture_content, {DIGEST: digest, SIGNER: tuple(signers)},
                       dict(fingerprints))

    def span(self, name: str, attributes: Mapping[str, Any], *, kind: str = "internal",
             quiet: tuple[type[BaseException], ...] = ()) -> InSpan:
        """A span named `name` of `kind` (internal, client, server), current inside; an exception (but
        `quiet` ones) marks it failed, with its type, and its message only when content is captured."""
        return InSpan(self, name, attributes, kind, quiet)

    def content(self, value: Any) -> str:
        return json.dumps(value, ensure_ascii=False, default=str)


@functools.cache
def _api() -> Any:
    """What a span needs of the OpenTelemetry API, imported once (when the first span starts)."""
    from types import SimpleNamespace

    from opentelemetry.context import attach, detach
    from opentelemetry.trace import Status, StatusCode, get_current_span, set_span_in_context

    return SimpleNamespace(attach=attach, detach=detach, set_span_in_context=set_span_in_context, Status=Status,
                           ERROR=StatusCode.ERROR, get_current_span=get_current_span)


def _suspended() -> tuple[type[BaseException], ...]:
    return (Suspended,)


class InSpan:
    """Tracing.span: a class, not a generator, as a request makes five spans and more."""

    __slots__ = ("attributes", "kind", "name", "quiet", "span", "token", "tracing")

    def __init__(self, tracing: Tracing, name: str, attributes: Mapping[str, Any], kind: str,
                 quiet: tuple[type[BaseException], ...]) -> None:
        self.tracing, self.name, self.attributes, self.kind, self.quiet = tracing, name, attributes, kind, quiet

    def __enter__(self) -> Any:
        api = _api()
        tracing = self.tracing
        self.span = span = tracing.tracer.start(self.name, {**tracing.bundle, **self.attributes}, self.kind)
        self.token = api.attach(api.set_span_in_context(span))
        return span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        api, span = _api(), self.span
        try:
            if exc is not None and not isinstance(exc, self.quiet):
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(api.Status(api.ERROR, str(exc) if self.tracing.capture_content else None))
        finally:
            api.detach(self.token)
            span.end()


def _traceparent_of(span: Any) -> str | None:
    """The W3C `traceparent` naming `span`, as the SDK's propagator writes it (version 00), or None for
    a span of no valid context."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}" if context.is_valid else None


def _traceparent_env(span: Any) -> dict[str, str]:
    """`TRACEPARENT` naming `span`, for a program started inside it."""
    value = _traceparent_of(span)
    return {"TRACEPARENT": value} if value is not None else {}


class _Sandbox(InSpan):
    __slots__ = ()

    def __enter__(self) -> dict[str, str]:
        return _traceparent_env(super().__enter__())


def sandbox_span(tracing: Tracing, *, backend: str, tool: str) -> _Sandbox:
    """Around a tool's program in its sandbox: the environment it adds (`TRACEPARENT`, this span's)."""
    return _Sandbox(tracing, "heddle.sandbox", {"heddle.sandbox.safe": True, "heddle.sandbox.backend": backend,
                                                "gen_ai.tool.name": tool, **_fingerprint(tracing, tool)},
                    "internal", ())


def program_env() -> dict[str, str]:
    """What a program run outside a sandbox adds to its environment: `TRACEPARENT`, the current span's
    (its tool call's). No span of its own: a program started as it is adds nothing a trace would show
    beside its `execute_tool`, and a span costs as much as any other."""
    return _traceparent_env(_api().get_current_span())


@contextlib.contextmanager
def verify_span() -> Iterator[Any]:
    """Around a bundle's verification: the span (None when tracing is off) takes its digest and signers."""
    found = tracer()
    if found is None:
        yield None
        return
    with Tracing(found).span("heddle.bundle.verify", {}) as span:
        yield span


def _fingerprint(tracing: Tracing, tool: str) -> dict[str, str]:
    value = tracing.fingerprints.get(tool)
    return {FINGERPRINT: value} if value is not None else {}


def _tool_kind(ctx: RunContext, name: str) -> tuple[str, str]:
    """(heddle.tool.kind, gen_ai.tool.type) of a tool: a program of the tools folder, or the module
    of whatever provides it (a plugin, a command, a RemoteTool, an MCP server's tool, a ClientTool)."""
    provided: ProvidedTool | None = ctx.seams.tool(name) or ctx.document_tools.tools.get(name)
    if provided is None:
        return "program", "function"
    kind = type(provided).__module__.rsplit(".", 1)[-1]
    return kind, "extension" if kind in ("remote", "mcp") else "function"


def _server(url: str) -> dict[str, Any]:
    """server.address and server.port of a model's URL (never its path, query or credentials)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return {}
    return {"server.address": parts.hostname, "server.port": port} if parts.hostname else {}


def _tokens(turn: AssistantTurn) -> dict[str, Any]:
    usage = turn.usage or {}
    found = {}
    for key, name in (("prompt_tokens", "gen_ai.usage.input_tokens"),
                      ("completion_tokens", "gen_ai.usage.output_tokens")):
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            found[name] = value
    return found


class ModelObserver(Protocol):
    """What is told of each model call of a run (a server's metrics): the model, how long it took, the
    tokens it reported (`input`, `output`) and whether it answered."""

    def model_called(self, model: str, seconds: float, tokens: Mapping[str, int], ok: bool) -> None: ...


class MeasuredSeams(SeamsLayer):
    """A run's seams, each model call timed for a `ModelObserver`."""

    def __init__(self, inner: RunSeams, observer: ModelObserver) -> None:
        super().__init__(inner)
        self.observer = observer

    async def call_model(self, request: ModelRequest, next: ModelStep) -> AssistantTurn:
        started = time.perf_counter()
        try:
            turn = await self.inner.call_model(request, next)
        except Exception:
            self.observer.model_called(request.endpoint.model_id, time.perf_counter() - started, {}, False)
            raise
        tokens = {k.rsplit(".", 2)[-2]: v for k, v in _tokens(turn).items()}  # input, output
        self.observer.model_called(request.endpoint.model_id, time.perf_counter() - started, tokens, True)
        return turn


class TracedSeams(SeamsLayer):
    """A run's seams inside spans."""

    def __init__(self, inner: RunSeams, tracing: Tracing, ctx: RunContext, flow: c.Flow) -> None:
        super().__init__(inner)
        self.tracing = tracing
        self.ctx = ctx
        self.flow = flow
        self._span: contextlib.ExitStack | None = None
        self._root: Any = None

    def node(self, node: c.Node, inputs: dict[str, Any], next: NodeStep) -> Coroutine[Any, Any, Outcome]:
        # Not a coroutine of its own: a node that is not an agent's passes through no frame of this layer.
        agent = getattr(node, "agent", None) if node.component_type == "AgentNode" else None
        if agent is None:
            return self.inner.node(node, inputs, next)
        return self._agent(node, agent, inputs, next)

    async def _agent(self, node: c.Node, agent: Any, inputs: dict[str, Any], next: NodeStep) -> Outcome:
        with self.tracing.span(f"invoke_agent {agent.name}", {
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent.name,
                "gen_ai.agent.id": agent.id, "heddle.node": node.name}, quiet=_suspended()):
            return await self.inner.node(node, inputs, next)

    async def call_tool(self, request: ToolRequest, next: ToolStep) -> dict[str, Any]:
        kind, tool_type = _tool_kind(self.ctx, request.tool)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": request.tool,
                                      "gen_ai.tool.type": tool_type, "heddle.tool.kind": kind,
                                      "heddle.node": request.node, **_fingerprint(self.tracing, request.tool)}
        if request.call_id is not None:
            attributes["gen_ai.tool.call.id"] = request.call_id
        if self.tracing.capture_content:
            attributes["gen_ai.tool.call.arguments"] = self.tracing.content(request.arguments)
        started = time.perf_counter()
        with self.tracing.span(f"execute_tool {request.tool}", attributes, quiet=_suspended()) as span:
            try:
                output = await self.inner.call_tool(request, next)
            except Exception as exc:
                if not isinstance(exc, _suspended()):  # a ClientTool's call waits for its result
                    span.set_attribute("heddle.tool.outcome", "error")
                span.set_attribute("heddle.tool.duration_ms", (time.perf_counter() - started) * 1000)
                raise
            span.set_attributes({"heddle.tool.outcome": "ok",
                                 "heddle.tool.duration_ms": (time.perf_counter() - started) * 1000})
            code = output.get("exit_code") if kind == "command_run" else None
            if isinstance(code, int):
                span.set_attribute("heddle.tool.exit_code", code)
            if self.tracing.capture_content:
                span.set_attribute("gen_ai.tool.call.result", self.tracing.content(output))
            return output

    async def call_model(self, request: ModelRequest, next: ModelStep) -> AssistantTurn:
        model = request.endpoint.model_id
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model,
                                      "heddle.node": request.node, **_server(request.endpoint.base_url)}
        if self.tracing.capture_content:
            attributes["gen_ai.input.messages"] = self.tracing.content(request.messages)
        with self.tracing.span(f"chat {model}", attributes, kind="client") as span:
            turn = await self.inner.call_model(request, next)
            span.set_attributes(_tokens(turn))
            if turn.finish_reason is not None:
                span.set_attribute("gen_ai.response.finish_reasons", (turn.finish_reason,))
            if self.tracing.capture_content:
                span.set_attribute("gen_ai.output.messages", self.tracing.content([turn.as_message()]))
            return turn

    def event(self, event: ev.Event, next: ev.EventSink) -> None:
        if self._root is not None and event.type == "waiting":
            self._root.set_attribute("heddle.run.waiting", str(getattr(event, "waiting_for", {}).get("kind", "")))
        self.inner.event(event, next)

    async def finish(self, state: dict[str, Any]) -> None:
        if self._root is not None and self.tracing.capture_content:
            self._root.set_attribute("heddle.run.state", self.tracing.content(state))
        await self.inner.finish(state)

    async def __aenter__(self) -> Self:
        stack = contextlib.ExitStack()
        flow = self.flow
        self._root = stack.enter_context(self.tracing.span(f"invoke_agent {flow.name}", {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": flow.name, "gen_ai.agent.id": flow.id}))
        try:
            await self.inner.__aenter__()
        except BaseException:
            stack.__exit__(*sys.exc_info())
            raise
        self._span = stack
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            await self.inner.__aexit__(exc_type, exc, tb)
        finally:
            stack, self._span = self._span, None
            if stack is not None:
                stack.__exit__(exc_type, exc, tb)
