"""RemoteTool: the HTTP request a document declares, made from each call's arguments.

How a call becomes a request, as the Agent Spec reference says ("Remote Tools") and where it
leaves a choice to the runtime:

- `{{placeholders}}` in the url, http_method, data (a string, or the string values inside it),
  query_params values and headers values are the tool's inputs (inferred as strings when the
  tool declares none). A value put into the url is percent-encoded whole, so an argument fills
  one path segment or query value and never changes where the request goes: the url's scheme
  and host are the document's own, and may not hold a placeholder.
- `data` is the body: a string as it is, anything else as JSON (as form fields when the headers
  say `application/x-www-form-urlencoded`). The default `{}` sends no body on GET, HEAD, DELETE
  and OPTIONS.
- Secrets come from the environment only: a header value `$NAME` (or `${NAME}`) is read where
  the run starts, never from a call's arguments; `sensitive_headers` must be such references.
- Redirects are followed on the same host (at most `MAX_REDIRECTS`, never from https to http);
  one to another host fails the call. `url_allow_list`, when given, is checked on every request:
  scheme and host:port exact, path by prefix. The response is read up to `MAX_RESPONSE_BYTES`.
- The response gives the tool's outputs: a single output is the whole body (the JSON value when
  it fits the output's type, else the text), several come from the keys of a JSON object body,
  and a tool that declares none gives `{"http_response": body}`.

A call that fails (a status other than 2xx, a timeout, a refused redirect) is a tool error, which
an agent's model sees and a ToolNode fails with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from heddle.engine.templates import as_text, placeholders, render
from heddle.errors import ToolError, UsageError
from heddle.secret_env import header_from_env
from heddle.tools.provided import DocumentTools

if TYPE_CHECKING:
    import httpx

    from heddle.engine.context import RunContext
    from heddle.engine.seams import ToolRequest
    from heddle.spec import components as c
    from heddle.surface import Surface

MiB = 1024 * 1024
MAX_RESPONSE_BYTES = 10 * MiB
MAX_REDIRECTS = 5
NO_OUTPUTS = "http_response"  # the output of a tool that declares none (WayFlow's name for it)

_ORIGIN = re.compile(r"(?i)(https?)://([^/?#]*)")
_METHOD = re.compile(r"[A-Za-z]+\Z")
_BODYLESS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_FORM = "application/x-www-form-urlencoded"


def _label(tool: c.RemoteTool) -> str:
    return f"RemoteTool {tool.name!r}"


# --------------------------------------------------------------------------- the definition


def _strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """(where, text) for every string inside `value` (values of mappings, items of lists)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{where}[{i}]")


def templates(tool: c.RemoteTool) -> Iterator[tuple[str, str]]:
    """(field, text) for each attribute of the tool whose placeholders are its inputs."""
    yield "url", tool.url
    yield "http_method", tool.http_method
    yield from _strings(tool.data, "data")
    yield from _strings(tool.query_params, "query_params")
    yield from _strings(tool.headers, "headers")


def inferred_inputs(tool: c.RemoteTool) -> list[dict[str, Any]]:
    """One string input per placeholder, for a tool that declares no inputs."""
    names: dict[str, None] = {}
    for _, text in templates(tool):
        names.update(dict.fromkeys(placeholders(text)))
    return [{"title": name, "type": "string"} for name in names]


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, scheme: str, host: str, port: int | None) -> Origin:
        scheme = scheme.lower()
        return cls(scheme, host.lower().strip("[]"), port or _DEFAULT_PORTS[scheme])


def url_origin(url: str) -> Origin | None:
    """The scheme, host and port an http(s) URL names; None when it names none, or writes
    credentials or a placeholder where the host goes."""
    match = _ORIGIN.match(url.strip())
    if match is None:
        return None
    authority = match.group(2)
    if not authority or "{" in authority or "}" in authority or "@" in authority or "$" in authority:
        return None
    try:
        parts = urlsplit(f"{match.group(1)}://{authority}/")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    return Origin.of(match.group(1), host, port) if host else None


@dataclass(frozen=True)
class Allowed:
    """One `url_allow_list` entry: scheme and host:port exactly, path by prefix."""

    origin: Origin
    path: str

    @classmethod
    def parse(cls, entry: str) -> Allowed | None:
        origin = url_origin(entry)
        if origin is None:
            return None
        return cls(origin, urlsplit(entry.strip()).path or "/")

    def admits(self, origin: Origin, path: str) -> bool:
        return origin == self.origin and (path or "/").startswith(self.path)


def _header_problems(tool: c.RemoteTool) -> Iterator[str]:
    from heddle.spec.components import env_reference

    for field, headers in (("headers", tool.headers), ("sensitive_headers", tool.sensitive_headers)):
        for name, value in headers.items():
            if not isinstance(value, (str, int, float, bool)):
                yield f"{field} {name!r} must be a string, not {type(value).__name__}"
            elif field == "sensitive_headers" and (not isinstance(value, str) or env_reference(value) is None):
                yield (f"sensitive_headers {name!r} must be a $VAR reference: a secret is read from the "
                       "environment where the run starts, never written in the document")
            elif isinstance(value, str) and value.startswith("$") and env_reference(value) is None:
                yield f"{field} {name!r} value {value!r} is not a valid environment variable reference; write $NAME"
    both = sorted({n.lower() for n in tool.headers} & {n.lower() for n in tool.sensitive_headers})
    if both:
        yield f"header {both[0]!r} is in both headers and sensitive_headers; keep one"


def definition_problems(tool: c.RemoteTool) -> list[str]:
    """What makes the tool's request impossible to send as the document says, before any call."""
    problems: list[str] = []
    origin = url_origin(tool.url)
    if origin is None:
        problems.append(f"url {tool.url!r} must be an http:// or https:// URL whose host the document writes out "
                        "(a placeholder may fill its path and query, not its host; credentials go in "
                        "sensitive_headers as $VAR references)")
    if not placeholders(tool.http_method) and not _METHOD.match(tool.http_method.strip()):
        problems.append(f"http_method {tool.http_method!r} is not an HTTP method (GET, POST, ...)")
    problems.extend(_header_problems(tool))
    declared = tool.input_titles()
    for field, text in templates(tool):
        for name in placeholders(text):
            if name not in declared:
                problems.append(f"{field} has the placeholder {{{{{name}}}}}, which is none of its inputs "
                                f"({', '.join(declared) or 'none'}); declare it as an input")
    if tool.retry_policy is not None:
        problems.append("retry_policy is not supported by heddle yet; drop it (a failed call is a tool error "
                        "an agent's model can retry)")
    if tool.url_allow_list is not None:
        allowed = []
        for entry in tool.url_allow_list:
            parsed = Allowed.parse(entry) if isinstance(entry, str) else None
            if parsed is None:
                problems.append(f"url_allow_list entry {entry!r} is not an http(s) URL with a host")
            else:
                allowed.append(parsed)
        if origin is not None and allowed and not any(a.origin == origin for a in allowed):
            problems.append(f"url {tool.url!r} is on a host none of its url_allow_list entries allows")
    return problems


def check_definition(tool: c.RemoteTool) -> None:
    """Raise ValueError (reported as the document's error, with its path) naming every problem."""
    problems = definition_problems(tool)
    if problems:
        raise ValueError(f"{_label(tool)}: " + "; ".join(problems))


# --------------------------------------------------------------------------- one call


@dataclass(frozen=True)
class Outgoing:
    """The request one call makes."""

    method: str
    url: str
    params: list[tuple[str, str | int | float | bool | None]]
    headers: dict[str, str]
    content: bytes | None


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


def build_request(tool: c.RemoteTool, arguments: Mapping[str, Any], secrets: Mapping[str, str]) -> Outgoing:
    """The request for one call with `arguments` (checked, defaults filled); `secrets` are the
    header values read from the environment, by header name."""
    texts = {name: as_text(value) for name, value in arguments.items()}
    url = render(tool.url.strip(), {name: quote(text, safe="") for name, text in texts.items()})
    method = render(tool.http_method, texts).strip().upper()
    if not _METHOD.match(method):
        raise ToolError(tool.name, f"http_method {tool.http_method!r} became {method!r}, which is not an HTTP method")
    params: list[tuple[str, str | int | float | bool | None]] = []
    for key, value in tool.query_params.items():
        for item in value if isinstance(value, list) else [value]:
            if item is not None:
                params.append((key, as_text(_fill(item, texts))))
    headers: dict[str, str] = {}
    for source in (tool.headers, tool.sensitive_headers):
        for name, value in source.items():
            text = secrets[name] if name in secrets else as_text(_fill(value, texts))
            if "\r" in text or "\n" in text:
                raise ToolError(tool.name, f"header {name!r} would hold a line break; an argument may not end a header")
            headers[name] = text
    content: bytes | None = None
    data = tool.data
    if isinstance(data, str):
        content = render(data, texts).encode("utf-8") if data else None
    elif data is not None and not (data == {} and method in _BODYLESS):
        filled = _fill(data, texts)
        kind = _content_type(headers)
        if isinstance(filled, dict) and kind is not None and kind.split(";")[0].strip().lower() == _FORM:
            content = urlencode([(str(k), as_text(v)) for k, v in filled.items()]).encode("ascii")
        else:
            content = json.dumps(filled, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            if kind is None:
                headers["Content-Type"] = "application/json"
    return Outgoing(method, url, params, headers, content)


# --------------------------------------------------------------------------- the response


@dataclass(frozen=True)
class Body:
    text: str
    is_json: bool
    value: Any  # the JSON value when the body is JSON, else None


def _fits(prop: dict[str, Any], value: Any) -> bool:
    import jsonschema

    schema = {k: v for k, v in prop.items() if k not in ("title", "default", "description")}
    try:
        return bool(jsonschema.Draft202012Validator(schema).is_valid(value))
    except jsonschema.exceptions.SchemaError:
        return False


def _parsed(text: str) -> tuple[bool, Any]:
    from heddle.safeparse import loads_json

    try:
        return True, loads_json(text)
    except ValueError:
        return False, None


def _types(prop: dict[str, Any]) -> str:
    declared = prop.get("type")
    return "/".join(declared) if isinstance(declared, list) else str(declared or "any")


def _one_output(tool: c.RemoteTool, prop: dict[str, Any], body: Body) -> Any:
    # The JSON value first when the server says it is JSON, the text first otherwise: a string
    # output of a JSON "text" is its text, of a text/plain body the body as it is.
    candidates: list[Any] = []
    if body.is_json:
        candidates += [body.value, body.text]
    else:
        ok, value = _parsed(body.text)
        candidates += [body.text, value] if ok else [body.text]
    for candidate in candidates:
        if _fits(prop, candidate):
            return candidate
    raise ToolError(tool.name, f"output {prop['title']!r} is declared {_types(prop)}, but the response "
                               f"({_excerpt(body.text)}) is not one")


def _outputs(tool: c.RemoteTool, body: Body) -> dict[str, Any]:
    if not tool.outputs:
        return {NO_OUTPUTS: body.value if body.is_json else body.text}
    if len(tool.outputs) == 1:
        prop = tool.outputs[0]
        return {prop["title"]: _one_output(tool, prop, body)}
    value = body.value if body.is_json else _parsed(body.text)[1]
    if not isinstance(value, dict):
        raise ToolError(tool.name, f"declares {len(tool.outputs)} outputs, so its response must be a JSON object "
                                   f"with their names, not {_excerpt(body.text)}")
    out: dict[str, Any] = {}
    for prop in tool.outputs:
        title = prop["title"]
        if title not in value:
            if "default" not in prop:
                raise ToolError(tool.name, f"the response has no {title!r}, an output it declares without a default")
            out[title] = prop["default"]
            continue
        item = value[title]
        if not _fits(prop, item) and "string" in _types(prop).split("/"):
            item = as_text(item)  # every type converts to a string (Agent Spec type compatibility)
        if not _fits(prop, item):
            raise ToolError(tool.name, f"output {title!r} is declared {_types(prop)}, but the response gives "
                                       f"{_excerpt(as_text(item))}")
        out[title] = item
    return out


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


# --------------------------------------------------------------------------- sending


@dataclass
class RemoteCall:
    """One RemoteTool as a run calls it (heddle.engine.seams.ProvidedTool)."""

    tool: c.RemoteTool
    client: httpx.AsyncClient
    secrets: dict[str, str]
    timeout: float | None
    surface: Surface

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        from heddle.tools.schema import checked_arguments

        return checked_arguments(self.tool, arguments)

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        outgoing = build_request(self.tool, request.arguments, self.secrets)
        try:
            async with asyncio.timeout(self.timeout):
                return await self._send(outgoing)
        except TimeoutError:
            raise ToolError(self.tool.name, f"{outgoing.method} {outgoing.url} timed out after "
                                            f"{self.surface.duration(self.timeout or 0)} (raise "
                                            f"{self.surface.flag('tool_timeout')} if it needs longer)") from None

    def _allowed(self, url: httpx.URL, origin: Origin) -> None:
        allow = self.tool.url_allow_list
        if allow is None:
            return
        entries = [a for a in (Allowed.parse(e) for e in allow) if a is not None]
        if not any(a.admits(origin, url.raw_path.decode("ascii").split("?", 1)[0]) for a in entries):
            raise ToolError(self.tool.name, f"{url} is not allowed by its url_allow_list")

    async def _send(self, outgoing: Outgoing) -> dict[str, Any]:
        import httpx

        name = self.tool.name
        request = self.client.build_request(outgoing.method, outgoing.url, params=list(outgoing.params),
                                            headers=outgoing.headers, content=outgoing.content)
        first = Origin.of(request.url.scheme, request.url.host, request.url.port)
        for _ in range(MAX_REDIRECTS + 1):
            if request.url.scheme not in _DEFAULT_PORTS:
                raise ToolError(name, f"was redirected to {request.url}, which is not an http(s) URL")
            here = Origin.of(request.url.scheme, request.url.host, request.url.port)
            if here.host != first.host:
                raise ToolError(name, f"was redirected to {request.url}, another host than {first.host}; heddle "
                                      "follows redirects only on the host the document names")
            if first.scheme == "https" and here.scheme != "https":
                raise ToolError(name, f"was redirected from https to {request.url}; heddle does not follow that")
            self._allowed(request.url, here)
            try:
                response = await self.client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise ToolError(name, f"{request.method} {request.url}: {type(exc).__name__}: {exc}") from None
            try:
                if response.next_request is not None:
                    request = response.next_request
                    continue
                data = await _read_capped(name, response)
                if not response.is_success:
                    raise ToolError(name, f"{request.method} {request.url} answered HTTP {response.status_code} "
                                          f"{response.reason_phrase}: {_excerpt(data.decode('utf-8', 'replace'))}")
                content_type = response.headers.get("content-type")
                text = data.decode(response.charset_encoding or "utf-8", "replace")
                is_json = _is_json(content_type)
                value = None
                if is_json:
                    ok, value = _parsed(text)
                    if not ok:
                        raise ToolError(name, f"{request.url} answered {content_type} that is not valid JSON: "
                                              f"{_excerpt(text)}")
                return _outputs(self.tool, Body(text, is_json, value))
            except httpx.HTTPError as exc:
                raise ToolError(name, f"{request.method} {request.url}: {type(exc).__name__}: {exc}") from None
            finally:
                await response.aclose()
        raise ToolError(name, f"was redirected more than {MAX_REDIRECTS} times; heddle stops there")


async def _read_capped(name: str, response: httpx.Response) -> bytes:
    cap = MAX_RESPONSE_BYTES
    over = ToolError(name, f"{response.request.url} answered more than {_size(cap)}, the most heddle reads of a "
                           "RemoteTool's response")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise over
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > cap:
            raise over
    return bytes(data)


def _size(count: int) -> str:
    return f"{count // MiB} MiB" if count % MiB == 0 else f"{count} bytes"


# --------------------------------------------------------------------------- the run's tools


def remote_tools(root: c.Component) -> Iterator[tuple[str, c.RemoteTool]]:
    """(path, tool) for every RemoteTool of a document (its flows, nodes, agents), in document order."""
    from heddle.spec import components as c
    from heddle.spec.walk import of_type

    yield from of_type(root, c.RemoteTool)


def header_secrets(tool: c.RemoteTool, where: str) -> dict[str, str]:
    """The header values `tool` reads from the environment, by header name. Raises UsageError
    for a variable that is not set or is empty, naming it."""
    from heddle.spec.components import env_reference

    found: dict[str, str] = {}
    for source in (tool.headers, tool.sensitive_headers):
        for header, value in source.items():
            name = env_reference(value) if isinstance(value, str) else None
            if name is None:
                continue
            found[header] = header_from_env(f"{_label(tool)} at {where}", header, name, os.environ)
    return found


def header_env_reads(document: Any) -> Iterator[tuple[str, str]]:
    """(variable, what reads it) for each RemoteTool header of a resolved document (a mapping)
    that reads the environment, in document order; for `heddle doctor`, which reads no value."""
    from heddle.spec.components import env_reference

    stack: list[tuple[str, Any]] = [("$", document)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(node))))
        elif isinstance(node, dict):
            if node.get("component_type") == "RemoteTool":
                for field in ("headers", "sensitive_headers"):
                    headers = node.get(field)
                    for header, value in (headers.items() if isinstance(headers, dict) else ()):
                        name = env_reference(value) if isinstance(value, str) else None
                        if name is not None:
                            yield name, f"{field} {header!r} of RemoteTool {node.get('name')!r} at {path}"
            stack.extend((f"{path}.{key}", value) for key, value in reversed(node.items()) if key != "metadata")


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
        from heddle.lazytls import LazyTLSTransport

        async with httpx.AsyncClient(follow_redirects=False, timeout=httpx.Timeout(options.tool_timeout),
                                     transport=LazyTLSTransport()) as client:
            yield DocumentTools(tools={
                name: RemoteCall(tool, client, secrets[name], _timeout(tool, options.tool_timeout), options.surface)
                for name, (_, tool) in found.items()})


KIND = RemoteToolKind()
