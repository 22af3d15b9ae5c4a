"""RemoteTool: the HTTP request a document declares, made from each call's arguments.

How a call becomes a request and its answer the tool's output, as the Agent Spec reference runtime
(WayFlow's RemoteTool, which runs its ApiCallStep) does, shared with ApiNode (heddle.engine.api):

- `{{placeholders}}` in the url, http_method, data (a string, or the string values inside it),
  query_params values and headers values are the tool's inputs (inferred as strings when the
  tool declares none). An argument that is not a string fills a template as JSON writes it (`true`;
  an ApiNode's input as Python writes it, `True`); one put into the url is quoted as a form value (a
  space is `+`, `/` is `%2F`), so it never changes where the request goes: the url's scheme and host
  are the document's own, and may not hold a placeholder.
- `data` is the body, none when it is empty: a dict as JSON (Content-Type application/json), or as
  form fields when the headers say `application/x-www-form-urlencoded`; a string is sent as it is,
  unless it is JSON once filled, then as that JSON. An argument that would change the shape of such
  JSON (a quote inside a JSON string, more than one value outside one) fails the call instead.
- Secrets come from the environment only: a header value `$NAME` (or `${NAME}`) is read where
  the run starts, never from a call's arguments; `sensitive_headers` must be such references.
- Redirects are followed on the same host (at most `MAX_REDIRECTS`, never from https to http);
  one to another host fails the call. `url_allow_list`, when given, is checked on every request:
  scheme and host:port exact, path by prefix. The response is read up to `--max-response-bytes`
  once decoded (heddle.bounded), each request within its timeout.
- An answer other than 2xx is asked again at once, up to `ATTEMPTS` requests in all.
- The answer's text (read as UTF-8) is the tool's one output: a tool that declares none has one,
  `http_response`; one it declares must admit a string; a tool declaring several fails each call,
  as the reference runtime's ToolNode does.

A call that fails (a last answer other than 2xx, a timeout, a refused redirect) is a tool error,
which an agent's model sees and a ToolNode fails with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus, urlencode

from heddle.agentspec import components as c
from heddle.agentspec.components import DEFAULT_PORTS, HTTP_METHOD, Allowed, Origin, env_reference, request_label
from heddle.agentspec.fields import components_of
from heddle.agentspec.templates import PLACEHOLDER, as_text, placeholders, render
from heddle.agentspec.walk import document_components, of_type
from heddle.bounded import ACCEPT_ENCODING, BodyError, read_body
from heddle.engine.seams import IDEMPOTENCY_HEADER
from heddle.engine.tracing import REQUEST_HOOKS
from heddle.errors import ToolError, ToolOverrun, UsageError
from heddle.lazytls import LazyTLSTransport
from heddle.secret_env import header_from_env
from heddle.tools.provided import DocumentTools
from heddle.tools.schema import checked_arguments

if TYPE_CHECKING:
    import httpx

    from heddle.egress import EgressPolicy
    from heddle.engine.context import RunContext
    from heddle.engine.seams import ToolRequest
    from heddle.surface import Surface

    Spec = c.RemoteTool | c.ApiNode  # an HTTP request a document declares: a tool's, or a node's

MAX_REDIRECTS = 5
# The reference runtime's ApiCallStep without a retry_policy: an answer other than 2xx is asked again, twice.
ATTEMPTS = 3
NO_OUTPUTS = "http_response"  # the output of a tool that declares none (WayFlow's name for it)

_FORM = "application/x-www-form-urlencoded"


# --------------------------------------------------------------------------- one call


@dataclass(frozen=True)
class Outgoing:
    """The request one call makes."""

    method: str
    url: str
    params: list[tuple[str, str | int | float | bool | None]]
    headers: dict[str, str]
    content: bytes | None


def with_idempotency_key(outgoing: Outgoing, key: str | None) -> Outgoing:
    """`outgoing` with the call's idempotency key as its `Idempotency-Key` header (a session's step:
    heddle.engine.journal), unless the document sets that header itself."""
    if key is None or any(name.lower() == IDEMPOTENCY_HEADER.lower() for name in outgoing.headers):
        return outgoing
    return replace(outgoing, headers={**outgoing.headers, IDEMPOTENCY_HEADER: key})


def _fill(value: Any, values: Mapping[str, str]) -> Any:
    """`value` with the placeholders of each string inside it filled."""
    if isinstance(value, str):
        return render(value, values)
    if isinstance(value, dict):
        return {key: _fill(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [_fill(item, values) for item in value]
    return value


def _content_type(headers: Mapping[str, str]) -> str | None:
    return next((value for name, value in headers.items() if name.lower() == "content-type"), None)


def build_request(tool: Spec, arguments: Mapping[str, Any], secrets: Mapping[str, str]) -> Outgoing:
    """The request for one call with `arguments` (checked, defaults filled); `secrets` are the
    header values read from the environment, by header name.

    A RemoteTool's request and an ApiNode's are made as the reference runtime's ApiCallStep makes
    both: a value fills a template as Python writes it (`True`, not `true`), a url value is quoted as
    a form value (a space becomes `+`), and the body is `_api_body`'s. A RemoteTool's arguments reach
    that step as strings (its inputs there are its placeholders, strings): a value of another type
    as JSON writes it (`true`, `["\\u00e9"]`), null as the empty string."""
    if tool.component_type == "RemoteTool":
        arguments = {name: _step_string(value) for name, value in arguments.items()}
    texts = {name: _python_text(value) for name, value in arguments.items()}
    url = render(tool.url.strip(), {name: _api_url_value(tool.name, value) for name, value in arguments.items()})
    method = render(tool.http_method, texts).strip().upper()
    if not HTTP_METHOD.match(method):
        raise ToolError(tool.name, f"http_method {tool.http_method!r} became {method!r}, which is not an HTTP method")
    params: list[tuple[str, str | int | float | bool | None]] = []
    for key, value in tool.query_params.items():
        for item in value if isinstance(value, list) else [value]:
            params.append((key, _form_value(_fill(item, texts))))
    headers: dict[str, str] = {}
    for source in (tool.headers, tool.sensitive_headers):
        for name, value in source.items():
            text = secrets[name] if name in secrets else as_text(_fill(value, texts))
            if "\r" in text or "\n" in text:
                raise ToolError(tool.name, f"header {name!r} would hold a line break; an argument may not end a header")
            headers[name] = text
    content = _api_body(tool.name, tool.data, texts, headers)
    return Outgoing(method, url, params, headers, content)


def _step_string(value: Any) -> str:
    # The reference runtime's cast of a value to a string input (json.dumps, ASCII escapes and all).
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value)


def _python_text(value: Any) -> str:
    # How a Jinja template (the reference runtime's) writes a value: str() of it.
    return value if isinstance(value, str) else str(value)


def _api_url_value(name: str, value: Any) -> str:
    if isinstance(value, str):
        return quote_plus(value)
    if isinstance(value, (int, float, bool)):
        return str(value)
    raise ToolError(name, f"a {type(value).__name__} cannot fill its url; only a string, a number or a boolean can")


def _form_value(value: Any) -> str:
    # httpx's reading of a form or query value.
    if value is True or value is False:
        return "true" if value else "false"
    return "" if value is None else str(value)


def _api_body(name: str, data: Any, texts: Mapping[str, str], headers: dict[str, str]) -> bytes | None:
    """The body (the reference runtime's): none when its data is empty; its data filled, a string sent
    as it is unless it is then JSON; JSON (Content-Type application/json unless its headers give one),
    or form fields when its Content-Type says so.

    A string that is JSON once filled is refused (a ToolError) when an argument changed its shape:
    the reference runtime would send what the argument made of it, heddle sends nothing."""
    if not data:
        return None
    kind = _content_type(headers)
    form = kind is not None and _FORM in kind
    filled = _fill(data, texts)
    if isinstance(filled, str):
        text: str = filled
        try:
            filled = json.loads(text)
        except ValueError:
            return text.encode("utf-8")
        if isinstance(data, str) and placeholders(data) and json.loads(_render_json(name, data, texts)) != filled:
            raise ToolError(name, "an argument would change the shape of its JSON body (a quote or a backslash "
                                  "in a value that fills a JSON string); heddle does not send it")
    if form:
        if not isinstance(filled, dict):
            raise ToolError(name, f"its Content-Type is {kind!r}, and its data, a {type(filled).__name__}, is not "
                                  "form fields")
        pairs = [(str(k), _form_value(item)) for k, v in filled.items()
                 for item in (v if isinstance(v, (list, tuple)) else [v])]
        return urlencode(pairs).encode("utf-8")
    if kind is None:
        headers["Content-Type"] = "application/json"
    try:
        return json.dumps(filled, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except ValueError as exc:
        raise ToolError(name, f"its data is not JSON: {exc}") from None


def _json_pieces(template: str) -> Iterator[tuple[str, str | None, bool]]:
    """(text, placeholder name or None, inside a JSON string) for each piece of `template` read as
    JSON text: a placeholder is inside a string when an unescaped quote opened one before it."""
    inside, escaped, at, start = False, False, 0, 0
    while at < len(template):
        match = PLACEHOLDER.match(template, at)
        if match is not None:
            yield template[start:at], None, inside
            yield match.group(0), match.group(1), inside
            at = start = match.end()
            escaped = False
            continue
        char = template[at]
        if inside and escaped:
            escaped = False
        elif inside and char == "\\":
            escaped = True
        elif char == '"':
            inside = not inside
        at += 1
    yield template[start:], None, inside


def _render_json(name: str, template: str, texts: Mapping[str, str]) -> str:
    """A JSON body template filled so that no argument changes its shape: inside a string a value
    is JSON-escaped; elsewhere it must be one JSON value, or the call fails."""
    out: list[str] = []
    for piece, field, inside in _json_pieces(template):
        if field is None or field not in texts:
            out.append(piece)
            continue
        text = texts[field]
        if inside:
            out.append(json.dumps(text, ensure_ascii=False)[1:-1])
            continue
        try:
            json.loads(text)
        except ValueError:
            raise ToolError(name, f"argument {field!r} fills a value of its JSON body, and {_excerpt(text)} is not "
                                  "one JSON value; quote the placeholder in the data template for a string") from None
        out.append(text)
    return "".join(out)


# --------------------------------------------------------------------------- the response


def _fits(prop: dict[str, Any], value: Any) -> bool:
    import jsonschema

    schema = {k: v for k, v in prop.items() if k not in ("title", "default", "description")}
    try:
        return bool(jsonschema.Draft202012Validator(schema).is_valid(value))
    except jsonschema.exceptions.SchemaError:
        return False


def _types(prop: dict[str, Any]) -> str:
    declared = prop.get("type")
    return "/".join(declared) if isinstance(declared, list) else str(declared or "any")


def _outputs(tool: c.RemoteTool, answer: Answer) -> dict[str, Any]:
    """A 2xx answer as the tool's outputs, as the reference runtime gives them: its text, whole (the
    step's `http_response`), is the tool's one output; a tool that declares none has that one."""
    text = answer.text()
    if not tool.outputs:
        return {NO_OUTPUTS: text}
    if len(tool.outputs) > 1:
        raise ToolError(tool.name, f"declares {len(tool.outputs)} outputs ({', '.join(tool.output_titles())}), and "
                                   "a RemoteTool's answer is one value, its text (as the reference runtime gives it); "
                                   "declare one output")
    prop = tool.outputs[0]
    if not _fits(prop, text):
        raise ToolError(tool.name, f"output {prop['title']!r} is declared {_types(prop)}, and its answer is text "
                                   f"({_excerpt(text)}), as the reference runtime gives a RemoteTool's answer; "
                                   "declare the output a string")
    return {prop["title"]: text}


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "…")


# --------------------------------------------------------------------------- sending


@dataclass
class RemoteCall:
    """One RemoteTool as a run calls it (heddle.engine.seams.ProvidedTool)."""

    tool: c.RemoteTool
    client: httpx.AsyncClient
    secrets: dict[str, str]
    timeout: float | None
    surface: Surface
    max_bytes: int
    egress: EgressPolicy | None = None  # the bundle's sealed allow-lists, if it declares any

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return checked_arguments(self.tool, arguments)

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        outgoing = with_idempotency_key(build_request(self.tool, request.arguments, self.secrets),
                                        request.idempotency_key)
        answer = await send_asking_again(self.client, outgoing, allow_list=self.tool.url_allow_list,
                                         max_bytes=self.max_bytes, surface=self.surface, fail=self._fail,
                                         egress=(self.egress, self.tool.name), timeout=self.timeout,
                                         overrun=self._overrun)
        if not answer.ok:
            raise ToolError(self.tool.name, f"{answer.method} {answer.url} answered HTTP {answer.status} "
                                            f"{answer.reason} ({ATTEMPTS} times, as the reference runtime asks): "
                                            f"{_excerpt(answer.text())}")
        return _outputs(self.tool, answer)

    def _fail(self, message: str, overrun: bool) -> Exception:
        return (ToolOverrun if overrun else ToolError)(self.tool.name, message)

    def _overrun(self, message: str) -> Exception:
        return ToolOverrun(self.tool.name, message)


# --------------------------------------------------------------------------- one request, shared with ApiNode

Fail = Callable[[str, bool], Exception]
"""The error of a failed request, from its message and whether the answer went past its cap."""


@dataclass(frozen=True)
class Answer:
    """A response, its body read whole within its cap."""

    method: str
    url: str
    status: int
    reason: str
    content_type: str | None
    data: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        # The reference runtime reads every answer as UTF-8, whatever charset it names.
        return self.data.decode("utf-8", "replace")


def _check_allowed(allow: list[str] | None, url: httpx.URL, origin: Origin, fail: Fail) -> None:
    if allow is None:
        return
    entries = [a for a in (Allowed.parse(e) for e in allow) if a is not None]
    if not any(a.admits(origin, url.raw_path.decode("ascii").split("?", 1)[0]) for a in entries):
        raise fail(f"{url} is not allowed by its url_allow_list", False)


async def send(client: httpx.AsyncClient, outgoing: Outgoing, *, allow_list: list[str] | None, max_bytes: int,
               surface: Surface, fail: Fail, egress: tuple[EgressPolicy | None, str] = (None, "")) -> Answer:
    """Send `outgoing`, following redirects on its host only (each hop checked against `allow_list`
    and against the egress allow-list of the component `egress` names, before it is sent), and read the
    answer's body within `max_bytes` once decoded. The caller bounds the whole exchange in time."""
    import httpx

    request = client.build_request(outgoing.method, outgoing.url, params=list(outgoing.params),
                                   headers=outgoing.headers, content=outgoing.content)
    first = Origin.of(request.url.scheme, request.url.host, request.url.port)
    for _ in range(MAX_REDIRECTS + 1):
        if request.url.scheme not in DEFAULT_PORTS:
            raise fail(f"was redirected to {request.url}, which is not an http(s) URL", False)
        here = Origin.of(request.url.scheme, request.url.host, request.url.port)
        if here.host != first.host:
            raise fail(f"was redirected to {request.url}, another host than {first.host}; heddle "
                       "follows redirects only on the host the document names", False)
        if first.scheme == "https" and here.scheme != "https":
            raise fail(f"was redirected from https to {request.url}; heddle does not follow that", False)
        _check_allowed(allow_list, request.url, here, fail)
        if egress[0] is not None:
            refused = egress[0].problem(egress[1], here.host, here.port)
            if refused is not None:
                raise fail(f"{request.method} {request.url}: {refused}", False)
        try:
            response = await client.send(request, stream=True)
        except httpx.InvalidURL:
            # httpx reads a redirect's Location as it answers, even one it will not follow.
            raise fail(f"{request.method} {request.url} redirected to a Location that is not a URL; "
                       "heddle follows redirects to http(s) URLs on the same host only", False) from None
        except httpx.HTTPError as exc:
            raise fail(f"{request.method} {request.url}: {type(exc).__name__}: {exc}", False) from None
        try:
            if response.next_request is not None:
                request = response.next_request
                continue
            data = await _read_capped(response, max_bytes, surface, fail)
            return Answer(request.method, str(request.url), response.status_code, response.reason_phrase,
                          response.headers.get("content-type"), data)
        except httpx.HTTPError as exc:
            raise fail(f"{request.method} {request.url}: {type(exc).__name__}: {exc}", False) from None
        finally:
            await response.aclose()
    raise fail(f"was redirected more than {MAX_REDIRECTS} times; heddle stops there", False)


async def send_asking_again(client: httpx.AsyncClient, outgoing: Outgoing, *, allow_list: list[str] | None,
                            max_bytes: int, surface: Surface, fail: Fail, timeout: float | None,
                            overrun: Callable[[str], Exception],
                            egress: tuple[EgressPolicy | None, str] = (None, "")) -> Answer:
    """`send`, asked again at once while the answer is not 2xx, up to `ATTEMPTS` requests in all (the
    reference runtime's ApiCallStep without a retry_policy, for a RemoteTool and an ApiNode alike),
    each request within `timeout`. The last answer is returned, 2xx or not; a request that gets no
    answer (a timeout, a refused redirect) fails at once, as there, without asking again."""
    for _ in range(ATTEMPTS):
        try:
            async with asyncio.timeout(timeout):
                answer = await send(client, outgoing, allow_list=allow_list, max_bytes=max_bytes, surface=surface,
                                    fail=fail, egress=egress)
        except TimeoutError:
            raise overrun(f"{outgoing.method} {outgoing.url} timed out after {surface.duration(timeout or 0)} "
                          f"(raise {surface.flag('tool_timeout')} if it needs longer)") from None
        if answer.ok:
            break
    return answer


async def _read_capped(response: httpx.Response, cap: int, surface: Surface, fail: Fail) -> bytes:
    try:
        # The caller's own timeout bounds the whole transfer (RemoteCall.run).
        return await read_body(response, what=f"{response.request.method} {response.request.url}", cap=cap,
                               cap_text=f"raise {surface.flag('max_response_bytes')} if it needs more")
    except BodyError as exc:
        raise fail(exc.message, True) from None


# --------------------------------------------------------------------------- the run's tools


def remote_tools(root: c.Component) -> Iterator[tuple[str, c.RemoteTool]]:
    """(path, tool) for every RemoteTool of a document (its flows, nodes, agents), in document order."""
    yield from of_type(root, c.RemoteTool)


def http_requests(root: c.Component) -> Iterator[tuple[str, Spec]]:
    """(path, component) for every request a document declares: its RemoteTools and ApiNodes."""
    for where, component in document_components(root):
        if isinstance(component, (c.RemoteTool, c.ApiNode)):
            yield where, component


def header_secrets(tool: Spec, where: str) -> dict[str, str]:
    """The header values `tool` reads from the environment, by header name. Raises UsageError
    for a variable that is not set or is empty, naming it."""
    found: dict[str, str] = {}
    for source in (tool.headers, tool.sensitive_headers):
        for header, value in source.items():
            name = env_reference(value) if isinstance(value, str) else None
            if name is None:
                continue
            found[header] = header_from_env(f"{request_label(tool)} at {where}", header, name, os.environ)
    return found


def header_env_reads(document: Any) -> Iterator[tuple[str, str]]:
    """(variable, what reads it) for each RemoteTool or ApiNode header of a resolved document (a mapping)
    that reads the environment, in document order; for `heddle doctor`, which reads no value."""
    for path, node in components_of(document):
        if node["component_type"] in ("RemoteTool", "ApiNode"):
            for field in ("headers", "sensitive_headers"):
                headers = node.get(field)
                for header, value in (headers.items() if isinstance(headers, dict) else ()):
                    name = env_reference(value) if isinstance(value, str) else None
                    if name is not None:
                        yield name, f"{field} {header!r} of {node['component_type']} {node.get('name')!r} at {path}"


def _timeout(tool: c.RemoteTool, run_limit: float | None) -> float | None:
    limits = [t for t in (tool.timeout, run_limit) if t is not None]
    return min(limits) if limits else None


class RemoteToolKind:
    """The RemoteTools of a run: one HTTP client for all their calls, closed when the run ends."""

    def wants(self, flow: c.Flow) -> bool:
        return next(remote_tools(flow), None) is not None

    def open(self, ctx: RunContext, flow: c.Flow) -> contextlib.AbstractAsyncContextManager[DocumentTools]:
        return self._open(ctx, flow)

    @contextlib.asynccontextmanager
    async def _open(self, ctx: RunContext, flow: c.Flow) -> AsyncIterator[DocumentTools]:
        import httpx

        options = ctx.options
        found = {tool.name: (where, tool) for where, tool in reversed(list(remote_tools(flow)))}
        if options.sandbox.deny_net and found:
            name, (where, _) = next(iter(found.items()))
            raise UsageError(f"RemoteTool {name!r} at {where} sends a request over the network, and --deny-net "
                             "gives tools no network; run without --deny-net to let it")
        secrets = {name: header_secrets(tool, where) for name, (where, tool) in found.items()}
        # Redirects are followed by hand (RemoteCall._send), each hop checked before it is sent.
        async with httpx.AsyncClient(follow_redirects=False, timeout=httpx.Timeout(options.tool_timeout),
                                     transport=LazyTLSTransport(), event_hooks=dict(REQUEST_HOOKS),
                                     headers={"Accept-Encoding": ACCEPT_ENCODING}) as client:
            yield DocumentTools(tools={
                name: RemoteCall(tool, client, secrets[name], _timeout(tool, options.tool_timeout), options.surface,
                                 options.max_response_bytes, options.egress)
                for name, (_, tool) in found.items()})


KIND = RemoteToolKind()
