"""Typed models of the Agent Spec components heddle runs.

The wire format is Agent Spec's own (snake_case fields, `component_type` as the tag). Fields we do
not use are kept (extra="allow") so a valid document is never refused for carrying them, and
so a document re-serialises as it was written.
"""

# Annotations are code here, not strings (no `from __future__ import annotations`): pydantic compiles and
# evaluates a string annotation of every field of every model as the model is made, a sixth of the time
# making them takes in each process. A name defined further down is quoted.
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import CoreSchema, PydanticKnownError, core_schema

from heddle.agentspec.specialized import specialised_fields
from heddle.agentspec.templates import placeholders

Property = dict[str, Any]
"""A JSON Schema fragment with a `title`: an input or output of a component."""


def node_key(node: "NodeBase") -> str:
    """Nodes are identified by id (names need not be unique); fall back to the name."""
    return node.id or node.name


# The types whose values pydantic will not read fields from (an object of any other type has its
# attributes read, as a model instance's are).
_NOT_OBJECTS = ("builtins", "datetime", "collections")


class Tagged:
    """`Annotated[A | B | ..., Tagged(...)]`: a tagged union whose members are validated by their
    own validators, each built the first time a document holds that member.

    pydantic builds a union's validator with every member's inside, so a Flow's took every node,
    tool, agent and transport model heddle has (some 160 model schemas) to read a flow of three
    ToolNodes. Here the union picks the member by its tag and hands the value to that member's
    validator, with the errors pydantic gives for a tagged union, word for word: the tag found by
    `on` (a field name, or a function of the value) and, when none is found or it names no member,
    the union's own error. A member's errors keep their location beneath the union's, without the
    tag pydantic puts between them (heddle.agentspec.document leaves it out of a document's error line).
    """

    def __init__(self, on: str | Callable[[Any], Any]) -> None:
        self.on = on

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        members: dict[str, type[BaseModel]] = {}
        for member in get_args(source):
            if get_origin(member) is Annotated:
                cls, metadata = get_args(member)[0], member.__metadata__
                tags = [m.tag for m in metadata if isinstance(m, Tag)]
            else:
                cls = member
                tags = list(get_args(cls.model_fields[str(self.on)].annotation))
            for tag in tags:
                members.setdefault(tag, cls)
        on = self.on
        named = f"{on.__name__}()" if callable(on) else repr(on)
        expected = ", ".join(f"'{tag}'" for tag in members)

        def validate(value: Any) -> Any:
            if callable(on):
                tag = on(value)
                if tag is None:
                    raise PydanticKnownError("union_tag_not_found", {"discriminator": named})
            else:
                if isinstance(value, dict):
                    if on not in value:
                        raise PydanticKnownError("union_tag_not_found", {"discriminator": named})
                    tag = value[on]
                elif type(value).__module__ in _NOT_OBJECTS:
                    raise PydanticKnownError("model_attributes_type")
                elif not hasattr(value, on):
                    raise PydanticKnownError("union_tag_not_found", {"discriminator": named})
                else:
                    tag = getattr(value, on)
            cls = members.get(tag) if isinstance(tag, str) else None
            if cls is None:
                raise PydanticKnownError("union_tag_invalid",
                                         {"discriminator": named, "tag": str(tag), "expected_tags": expected})
            return cls.__pydantic_validator__.validate_python(value)

        return core_schema.no_info_plain_validator_function(validate)


# Every model is built when it first validates, not when it is defined (defer_build): building all
# fifty models on import built the tree of types each reaches again for each of them, in every
# process; and a union of models (`Tagged`) builds a member's validator only when a document holds
# one, so reading a flow builds the models it uses, not every one heddle has. The default factories are
# Python functions, not `list` and `dict`: pydantic reads each factory's signature while building,
# and a builtin's signature is parsed from its text each time.
def _list() -> list[Any]:
    return []


def _dict() -> dict[str, Any]:
    return {}


class Component(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False, populate_by_name=True, defer_build=True)

    id: str = ""
    name: str = ""
    description: str | None = None
    metadata: dict[str, Any] | None = None


def _check_properties(value: list[Property] | None) -> list[Property]:
    props = list(value or [])
    seen: set[str] = set()
    for i, prop in enumerate(props):
        if not isinstance(prop, dict):
            # pydantic reports a ValueError as the document's error; a TypeError would escape
            raise ValueError(f"property {i} must be a JSON Schema object")  # noqa: TRY004
        title = prop.get("title")
        if not isinstance(title, str) or not title:
            raise ValueError(f"property {i} needs a non-empty string `title`")
        if title in seen:
            raise ValueError(f"two properties are titled {title!r}")
        seen.add(title)
    return props


class WithIO(Component):
    inputs: list[Property] = Field(default_factory=_list)
    outputs: list[Property] = Field(default_factory=_list)

    _io = field_validator("inputs", "outputs", mode="before")(
        classmethod(lambda cls, v: _check_properties(v))
    )

    def input_titles(self) -> list[str]:
        return [p["title"] for p in self.inputs]

    def output_titles(self) -> list[str]:
        return [p["title"] for p in self.outputs]


# --------------------------------------------------------------------------- LLM configs


class LlmConfigBase(Component):
    model_id: str
    default_generation_parameters: dict[str, Any] | None = None
    api_key: str | None = None
    # Replaces heddle's own retries and, with its request_timeout, --model-timeout for this model's
    # requests (heddle.model.client).
    retry_policy: "RetryPolicy | None" = None


class OpenAiCompatibleConfig(LlmConfigBase):
    component_type: Literal["OpenAiCompatibleConfig"] = "OpenAiCompatibleConfig"
    url: str


class VllmConfig(LlmConfigBase):
    component_type: Literal["VllmConfig"] = "VllmConfig"
    url: str


class OllamaConfig(LlmConfigBase):
    component_type: Literal["OllamaConfig"] = "OllamaConfig"
    url: str


class OpenAiConfig(LlmConfigBase):
    component_type: Literal["OpenAiConfig"] = "OpenAiConfig"
    url: str = "https://api.openai.com/v1"


# Gemini is called through its OpenAI-compatible endpoint, which carries everything a GeminiConfig
# with an AI Studio key asks (heddle.model.endpoints); Vertex AI's Google Cloud credentials are
# refused by name (heddle.agentspec.catalog).
GEMINI_OPENAI_URL = "https://generativelanguage.googleapis.com/v1beta/openai"
GEMINI_API_KEY_VARIABLE = "GEMINI_API_KEY"  # the reference runtime's key when auth gives none


class GeminiAIStudioAuthConfig(Component):
    component_type: Literal["GeminiAIStudioAuthConfig"] = "GeminiAIStudioAuthConfig"
    api_key: str | None = None


class GeminiConfig(LlmConfigBase):
    """A Gemini model with a Google AI Studio key. The reference runtime reads its model_id, auth and
    generation parameters, and calls Gemini's own service whatever `url`, `api_key`, `api_provider`
    or `api_type` say, so a document that sets one is refused rather than read otherwise."""

    component_type: Literal["GeminiConfig"] = "GeminiConfig"
    auth: GeminiAIStudioAuthConfig
    provider: Literal["google"] = "google"

    @model_validator(mode="before")
    @classmethod
    def _unread(cls, data: Any) -> Any:
        if isinstance(data, dict):
            label = f"GeminiConfig {data.get('name')!r}"
            # What the reference runtime does anyway may be said: Google's chat completions.
            said = {"api_provider": "google", "api_type": "chat_completions"}
            for field in ("url", "api_key", "api_provider", "api_type"):
                if data.get(field) is not None and data.get(field) != said.get(field):
                    fix = ("give the key as its auth's api_key" if field == "api_key" else
                           "remove it, or name another endpoint with an OpenAiCompatibleConfig")
                    raise ValueError(f"{label}: {field} is not read for a GeminiConfig, which calls Gemini's own "
                                     f"service; {fix}")
            model_id = data.get("model_id")
            if isinstance(model_id, str) and model_id.startswith("vertex_ai/"):
                raise ValueError(f"{label}: model_id {model_id!r} names a Vertex AI model, which needs Google Cloud "
                                 "credentials heddle does not obtain; name the AI Studio model (without vertex_ai/)")
        return data

    @property
    def url(self) -> str:
        return GEMINI_OPENAI_URL

    def wire_model_id(self) -> str:
        """The model as Gemini's OpenAI-compatible endpoint names it: without the `gemini/` prefix the
        reference runtime's client strips."""
        return self.model_id.removeprefix("gemini/")


LlmConfig = Annotated[
    OpenAiCompatibleConfig | VllmConfig | OllamaConfig | OpenAiConfig | GeminiConfig,
    Tagged("component_type"),
]


def written_api_key(config: LlmConfigBase) -> str | None:
    """The key a config's requests carry, as the document writes it (`$VAR` is read at run start): a
    GeminiConfig's is its auth's (without one, $GEMINI_API_KEY's, as the reference runtime reads it)."""
    if isinstance(config, GeminiConfig):
        return config.auth.api_key or None
    return config.api_key

# --------------------------------------------------------------------------- tools


class ServerTool(WithIO):
    component_type: Literal["ServerTool"] = "ServerTool"
    requires_confirmation: bool = False  # each call waits for a person's approval (heddle.agentspec.waits)


# --------------------------------------------------------------------------- remote, client and built-in tools
# RemoteTool (heddle.tools.remote sends its request), ClientTool (the client runs it: offered to
# an agent, a call needs a session, heddle.tools.client) and BuiltinTool (runs only when a plugin
# provides a tool of its name, heddle.agentspec.refusals).


def _none_is_empty_dict(value: Any) -> Any:
    return {} if value is None else value


class RemoteTool(WithIO):
    """An HTTP request whose url, method, query, headers and body are templated from the call's
    arguments. Inputs it does not declare are inferred from its `{{placeholders}}`."""

    component_type: Literal["RemoteTool"] = "RemoteTool"
    url: str
    http_method: str
    api_spec_uri: str | None = None  # describes the API; heddle never fetches it
    data: Any = Field(default_factory=_dict)
    query_params: dict[str, Any] = Field(default_factory=_dict)
    headers: dict[str, Any] = Field(default_factory=_dict)
    sensitive_headers: dict[str, Any] = Field(default_factory=_dict)
    url_allow_list: list[str] | None = None
    retry_policy: Any = None
    timeout: float | None = Field(default=None, gt=0)
    requires_confirmation: bool = False

    _empty = field_validator("query_params", "headers", "sensitive_headers", mode="before")(
        classmethod(lambda cls, v: _none_is_empty_dict(v))
    )

    @model_validator(mode="after")
    def _check_remote_tool(self) -> "RemoteTool":
        if "inputs" not in self.model_fields_set:
            self.inputs = inferred_inputs(self)
        check_definition(self)
        return self


class ClientTool(WithIO):
    component_type: Literal["ClientTool"] = "ClientTool"
    requires_confirmation: bool = False


class BuiltinTool(WithIO):
    component_type: Literal["BuiltinTool"] = "BuiltinTool"
    tool_type: str
    configuration: dict[str, Any] | None = None
    executor_name: str | list[str] | None = None
    tool_version: str | None = None
    requires_confirmation: bool = False


# --------------------------------------------------------------------------- MCP
# MCPTool, MCPToolBox and their client transports (heddle.tools.mcp connects to the servers).

_ENV_REFERENCE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))\Z")


def env_reference(value: str) -> str | None:
    """The variable a `$NAME` / `${NAME}` value names; None for a value written as itself."""
    match = _ENV_REFERENCE.match(value)
    return None if match is None else match.group(1) or match.group(2)


# --------------------------------------------------------------------------- HTTP requests
# What a RemoteTool or an ApiNode defines of its request, read and checked with the document
# (heddle.tools.remote sends it).

_ORIGIN = re.compile(r"(?i)(https?)://([^/?#]*)")
HTTP_METHOD = re.compile(r"[A-Za-z]+\Z")
DEFAULT_PORTS = {"http": 80, "https": 443}


def request_label(tool: "RemoteTool | ApiNode") -> str:
    return f"{tool.component_type} {tool.name!r}"


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


def templates(tool: "RemoteTool | ApiNode") -> Iterator[tuple[str, str]]:
    """(field, text) for each attribute of the tool whose placeholders are its inputs."""
    yield "url", tool.url
    yield "http_method", tool.http_method
    yield from _strings(tool.data, "data")
    yield from _strings(tool.query_params, "query_params")
    yield from _strings(tool.headers, "headers")


def inferred_inputs(tool: "RemoteTool | ApiNode") -> list[dict[str, Any]]:
    """One string input per placeholder, for a tool or node that declares no inputs (an ApiNode's
    api_spec_uri's too, as the specification infers them, though it is never fetched)."""
    names: dict[str, None] = {}
    spec_uri = [("api_spec_uri", tool.api_spec_uri)] if tool.component_type == "ApiNode" and tool.api_spec_uri else []
    for _, text in [*templates(tool), *spec_uri]:
        names.update(dict.fromkeys(placeholders(text)))
    return [{"title": name, "type": "string"} for name in names]


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, scheme: str, host: str, port: int | None) -> "Origin":
        scheme = scheme.lower()
        return cls(scheme, host.lower().strip("[]"), port or DEFAULT_PORTS[scheme])


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
    def parse(cls, entry: str) -> "Allowed | None":
        origin = url_origin(entry)
        if origin is None:
            return None
        return cls(origin, urlsplit(entry.strip()).path or "/")

    def admits(self, origin: Origin, path: str) -> bool:
        return origin == self.origin and (path or "/").startswith(self.path)


def _header_problems(tool: "RemoteTool | ApiNode") -> Iterator[str]:
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


def definition_problems(tool: "RemoteTool | ApiNode") -> list[str]:
    """What makes the tool's request impossible to send as the document says, before any call."""
    problems: list[str] = []
    origin = url_origin(tool.url)
    if origin is None:
        problems.append(f"url {tool.url!r} must be an http:// or https:// URL whose host the document writes out "
                        "(a placeholder may fill its path and query, not its host; credentials go in "
                        "sensitive_headers as $VAR references)")
    if not placeholders(tool.http_method) and not HTTP_METHOD.match(tool.http_method.strip()):
        problems.append(f"http_method {tool.http_method!r} is not an HTTP method (GET, POST, ...)")
    problems.extend(_header_problems(tool))
    declared = tool.input_titles()
    for field, text in templates(tool):
        for name in placeholders(text):
            if name not in declared:
                problems.append(f"{field} has the placeholder {{{{{name}}}}}, which is none of its inputs "
                                f"({', '.join(declared) or 'none'}); declare it as an input")
    if tool.retry_policy is not None:
        problems.append("retry_policy is not supported by heddle yet; drop it (without one, a response other "
                        "than 2xx is asked again up to twice, as the reference runtime does)")
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


def check_definition(tool: "RemoteTool | ApiNode") -> None:
    """Raise ValueError (reported as the document's error, with its path) naming every problem."""
    problems = definition_problems(tool)
    if problems:
        raise ValueError(f"{request_label(tool)}: " + "; ".join(problems))


DEFAULT_OUTPUT = "response"  # an ApiNode's output when it declares none
# A title WayFlow's jq query `.TITLE` reads as one key of the answer.
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_outputs(node: "ApiNode") -> None:
    """Refuse an output WayFlow reads with a jq query that is not one key of the answer."""
    for prop in node.outputs:
        title = prop["title"]
        if not _KEY.match(title):
            raise ValueError(f"{request_label(node)}: output {title!r} is read from the answer as the jq query "
                             f"'.{title}', which heddle does not evaluate (it reads an output by a key written "
                             "as letters, digits and _); rename the output to such a key of the answer")


class SessionParameters(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    read_timeout_seconds: float = Field(default=60.0, gt=0)


class _ClientTransport(Component):
    session_parameters: SessionParameters = Field(default_factory=SessionParameters)


class StdioTransport(_ClientTransport):
    """An MCP server heddle starts as a process and talks to over its stdin and stdout."""

    component_type: Literal["StdioTransport"] = "StdioTransport"
    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=_list)
    env: dict[str, str] | None = None
    cwd: str | None = None

    @field_validator("cwd")
    @classmethod
    def _inside_workspace(cls, value: str | None) -> str | None:
        # The server runs in a workspace of its own, like a tool: a cwd can only name a folder in it.
        if value is not None and (value.startswith(("/", "~")) or ".." in value.replace("\\", "/").split("/")):
            raise ValueError(f"cwd {value!r} is outside the server's workspace, where heddle runs every MCP "
                             "server; give a folder inside it (a relative path) or drop cwd")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name in value or {}:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"env {name!r} is not an environment variable name")
        return value


class _RemoteTransport(_ClientTransport):
    url: str
    auth: Any = None
    headers: dict[str, str] | None = None
    sensitive_headers: dict[str, str] | None = None
    retry_policy: Any = None

    @model_validator(mode="after")
    def _check_remote(self) -> "_RemoteTransport":
        label = f"{self.component_type} {self.name!r}"  # type: ignore[attr-defined]
        if not re.match(r"https?://[^/]", self.url):
            raise ValueError(f"{label}: url {self.url!r} is not an http(s) URL")
        for field in ("auth", "retry_policy"):
            if getattr(self, field) is not None:
                raise ValueError(f"{label}: {field} is not supported by heddle yet; drop it (credentials can go "
                                 "in sensitive_headers as $VAR references)")
        both = sorted(set(self.headers or {}) & set(self.sensitive_headers or {}))
        if both:
            raise ValueError(f"{label}: header {both[0]!r} is in both headers and sensitive_headers; keep one")
        for kind, headers in (("headers", self.headers), ("sensitive_headers", self.sensitive_headers)):
            for header, value in (headers or {}).items():
                if kind == "sensitive_headers" and env_reference(value) is None:
                    raise ValueError(f"{label}: sensitive_headers {header!r} must be a $VAR reference; a secret "
                                     "is never written in the document")
                if value.startswith("$") and env_reference(value) is None:
                    raise ValueError(f"{label}: {kind} {header!r} value {value!r} is not a valid environment "
                                     "variable reference; write it as $NAME")
        return self


class SSETransport(_RemoteTransport):
    component_type: Literal["SSETransport"] = "SSETransport"


class StreamableHTTPTransport(_RemoteTransport):
    component_type: Literal["StreamableHTTPTransport"] = "StreamableHTTPTransport"


class _MutualTLS(BaseModel):
    model_config = ConfigDict(defer_build=True)

    key_file: str = Field(min_length=1)
    cert_file: str = Field(min_length=1)
    ca_file: str = Field(min_length=1)


class SSEmTLSTransport(_MutualTLS, SSETransport):
    component_type: Literal["SSEmTLSTransport"] = "SSEmTLSTransport"  # type: ignore[assignment]


class StreamableHTTPmTLSTransport(_MutualTLS, StreamableHTTPTransport):
    component_type: Literal["StreamableHTTPmTLSTransport"] = "StreamableHTTPmTLSTransport"  # type: ignore[assignment]


ClientTransport = Annotated[
    StdioTransport | SSETransport | SSEmTLSTransport | StreamableHTTPTransport | StreamableHTTPmTLSTransport,
    Tagged("component_type"),
]


def _recoverable() -> dict[str, list[str]]:
    return {"409": [], "429": []}


class RetryPolicy(BaseModel):
    """How often, and after how long, a failed request is made again (the specification's RetryPolicy,
    with its defaults; heddle.tools.retry applies it where heddle honours it)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    max_attempts: int = Field(default=2, ge=0)  # retries, beside the first attempt
    request_timeout: float | None = Field(default=None, gt=0)
    initial_retry_delay: float = Field(default=1.0, ge=0)
    max_retry_delay: float = Field(default=8.0, ge=0)
    backoff_factor: float = Field(default=2.0, gt=0)
    jitter: Literal["equal", "full", "full_and_equal_for_throttle", "decorrelated"] | None = \
        "full_and_equal_for_throttle"
    service_error_retry_on_any_5xx: bool = True
    recoverable_statuses: dict[str, list[str]] = Field(default_factory=_recoverable)

    @model_validator(mode="after")
    def _check_delays(self) -> "RetryPolicy":
        if self.max_retry_delay < self.initial_retry_delay:
            raise ValueError("retry_policy: max_retry_delay must be greater than or equal to initial_retry_delay")
        return self


class MCPTool(WithIO):
    """One tool of an MCP server, by its name there."""

    component_type: Literal["MCPTool"] = "MCPTool"
    client_transport: ClientTransport
    retry_policy: RetryPolicy | None = None  # finding it in the listing, and each call (heddle.tools.retry)
    requires_confirmation: bool = False  # each call waits for a person's approval (heddle.agentspec.waits)

    def declares_inputs(self) -> bool:
        """Whether the document gives the tool's inputs (else the server's listing does)."""
        return "inputs" in self.model_fields_set


class MCPToolSpec(WithIO):
    """A tool a toolbox expects its server to list, with the signature it expects."""

    component_type: Literal["MCPToolSpec"] = "MCPToolSpec"
    requires_confirmation: bool = False  # each call of it waits for a person's approval, as its toolbox's may

    @model_validator(mode="after")
    def _check_spec(self) -> "MCPToolSpec":
        if len(self.outputs) > 1 or any(p.get("type", "string") != "string" for p in self.outputs):
            raise ValueError(f"MCPToolSpec {self.name!r}: its outputs may only be one string property")
        return self

    def declares_inputs(self) -> bool:
        return "inputs" in self.model_fields_set


class MCPToolBox(Component):
    """The tools an MCP server lists, offered to an agent (those `tool_filter` names, when it is given)."""

    component_type: Literal["MCPToolBox"] = "MCPToolBox"
    client_transport: ClientTransport
    retry_policy: RetryPolicy | None = None  # finding tool_filter's tools, and each call (heddle.tools.retry)
    tool_filter: list[MCPToolSpec | str] | None = None
    requires_confirmation: bool = False  # each call of each of its tools waits for a person's approval

    @model_validator(mode="after")
    def _check_toolbox(self) -> "MCPToolBox":
        names = [entry if isinstance(entry, str) else entry.name for entry in self.tool_filter or []]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"MCPToolBox {self.name!r}: tool_filter names {twice[0]!r} twice")
        return self


Tool = Annotated[ServerTool | MCPTool | RemoteTool | ClientTool | BuiltinTool, Tagged("component_type")]


# --------------------------------------------------------------------------- message transforms
# An agent's transforms rewrite the conversation its model is sent, each turn, as the reference
# runtime's do (heddle.engine.transforms): oversized messages, or the older part of a long
# conversation, summarised by a model. Their summaries are cached in an in-memory datastore (the
# default), in a Postgres table, or not at all (`datastore: null`); an Oracle datastore is refused.

# The entities a transform's cache collection holds: property -> its JSON type.
MESSAGE_CACHE_ENTITY = {"cache_key": "string", "cache_content": "string", "created_at": "number",
                        "last_used_at": "number"}
CONVERSATION_CACHE_ENTITY = {**MESSAGE_CACHE_ENTITY, "prefix_size": "integer"}
_SUMMARY_PLACEHOLDER = re.compile(r"\{\{\s*summary\s*\}\}")


class InMemoryCollectionDatastore(Component):
    component_type: Literal["InMemoryCollectionDatastore"] = "InMemoryCollectionDatastore"
    datastore_schema: dict[str, dict[str, Any]]


class TlsPostgresDatabaseConnectionConfig(Component):
    """How the reference runtime reaches a Postgres database: `user:password@URL/postgres` (URL is
    `host[:port]`; heddle also takes a unix socket directory as the host), with libpq's TLS settings.
    `user`, `password` and `sslkey` are sensitive: `$VAR` references, read where the run happens."""

    component_type: Literal["TlsPostgresDatabaseConnectionConfig"] = "TlsPostgresDatabaseConnectionConfig"
    user: str
    password: str
    url: str
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "require"
    sslcert: str | None = None
    sslkey: str | None = None
    sslrootcert: str | None = None
    sslcrl: str | None = None

    @model_validator(mode="after")
    def _check_postgres(self) -> "TlsPostgresDatabaseConnectionConfig":
        label = f"TlsPostgresDatabaseConnectionConfig {self.name!r}"
        for field in ("user", "password", "sslkey"):
            value = getattr(self, field)
            if value is not None and env_reference(value) is None:
                raise ValueError(f"{label}: {field} is a secret written into the document; write it as a $VAR "
                                 f"reference (e.g. \"$PG_{field.upper()}\") and set VAR where the flow runs")
        if "://" in self.url:
            raise ValueError(f"{label}: url {self.url!r} is host[:port] (the reference puts it after user:password@)")
        return self


class PostgresDatabaseDatastore(Component):
    """A transform's cache in an existing Postgres table named by its collection (heddle.engine.pgcache)."""

    component_type: Literal["PostgresDatabaseDatastore"] = "PostgresDatabaseDatastore"
    datastore_schema: dict[str, dict[str, Any]]
    connection_config: TlsPostgresDatabaseConnectionConfig


class _SummarizationTransform(Component):
    llm: LlmConfig
    summarization_instructions: str
    max_cache_size: int | None = Field(default=10_000, gt=0)
    max_cache_lifetime: int | None = Field(default=4 * 3600, gt=0)  # seconds
    cache_collection_name: str
    datastore: InMemoryCollectionDatastore | PostgresDatabaseDatastore | None = None

    def caches(self) -> bool:
        """Whether summaries are cached: in the default in-memory datastore when none is written, not
        at all when it is null."""
        return self.datastore is not None or "datastore" not in self.model_fields_set

    def template(self) -> str:
        raise NotImplementedError

    def _check_transform(self, entity: dict[str, str]) -> None:
        label = f"{self.component_type} {self.name!r}"  # type: ignore[attr-defined]
        # The reference renders the template with Jinja: only `{{summary}}` reads the same in heddle.
        rest = _SUMMARY_PLACEHOLDER.sub("", self.template())
        if any(mark in rest for mark in ("{{", "{%", "{#")):
            raise ValueError(f"{label}: its template may use only the {{{{summary}}}} placeholder; heddle does not "
                             "render other Jinja syntax, so the summary would read otherwise")
        if self.datastore is None:
            return
        collection = self.datastore.datastore_schema.get(self.cache_collection_name)
        if collection is None:
            raise ValueError(f"{label}: its datastore has no collection {self.cache_collection_name!r} (its "
                             f"cache_collection_name); it has {sorted(self.datastore.datastore_schema)}")
        properties = collection.get("properties") or {}
        for name, kind in entity.items():
            found = properties.get(name)
            # The reference runtime wants each column of the very type it writes.
            if not isinstance(found, dict) or found.get("type") != kind:
                raise ValueError(f"{label}: collection {self.cache_collection_name!r} of its datastore needs "
                                 f"property {name!r} of type {kind}")


class MessageSummarizationTransform(_SummarizationTransform):
    """Each message (or tool result) longer than `max_message_size` characters, sent as its summary."""

    component_type: Literal["MessageSummarizationTransform"] = "MessageSummarizationTransform"
    max_message_size: int = Field(default=20_000, gt=0)
    summarization_instructions: str = (
        "Please make a summary of this message. Include relevant information and keep it short. "
        "Your response will replace the message, so just output the summary directly, no introduction needed.")
    summarized_message_template: str = "Summarized message: {{summary}}"
    cache_collection_name: str = "summarized_messages_cache"

    def template(self) -> str:
        return self.summarized_message_template

    @model_validator(mode="after")
    def _check_message_transform(self) -> "MessageSummarizationTransform":
        self._check_transform(MESSAGE_CACHE_ENTITY)
        return self


class ConversationSummarizationTransform(_SummarizationTransform):
    """A conversation longer than `max_num_messages` messages (or `max_num_characters`), sent as a
    summary of its older part and its `min_num_messages` latest messages."""

    component_type: Literal["ConversationSummarizationTransform"] = "ConversationSummarizationTransform"
    max_num_messages: int | None = Field(default=50, gt=0)
    max_num_characters: int | None = Field(default=None, gt=0)
    min_num_messages: int = Field(default=10, gt=0)
    summarization_instructions: str = (
        "Please make a summary of this conversation. Include relevant information and keep it short. "
        "Your response will replace the messages, so just output the summary directly, no introduction needed.")
    summarized_conversation_template: str = "Summarized conversation: {{summary}}"
    cache_collection_name: str = "summarized_conversations_cache"

    def template(self) -> str:
        return self.summarized_conversation_template

    @model_validator(mode="after")
    def _check_conversation_transform(self) -> "ConversationSummarizationTransform":
        label = f"ConversationSummarizationTransform {self.name!r}"
        if (self.max_num_messages is None) == (self.max_num_characters is None):
            raise ValueError(f"{label}: give one of max_num_messages and max_num_characters (set max_num_messages "
                             "to null to count characters)")
        if self.max_num_messages is not None and self.max_num_messages <= self.min_num_messages:
            raise ValueError(f"{label}: max_num_messages ({self.max_num_messages}) must be greater than "
                             f"min_num_messages ({self.min_num_messages})")
        self._check_transform(CONVERSATION_CACHE_ENTITY)
        return self


Transform = Annotated[MessageSummarizationTransform | ConversationSummarizationTransform, Tagged("component_type")]


class Agent(WithIO):
    component_type: Literal["Agent"] = "Agent"
    llm_config: LlmConfig
    system_prompt: str = ""
    tools: list[Tool] = Field(default_factory=_list)
    toolboxes: list[MCPToolBox] = Field(default_factory=_list)
    # The specification's default: the agent may answer the user instead of giving its outputs.
    human_in_the_loop: bool = True
    transforms: list[Transform] = Field(default_factory=_list)


# --------------------------------------------------------------------------- SpecializedAgent


class AgentSpecializationParameters(WithIO):
    component_type: Literal["AgentSpecializationParameters"] = "AgentSpecializationParameters"
    additional_instructions: str | None = None
    additional_tools: list[Tool] | None = None
    human_in_the_loop: bool | None = None


# What a SpecializedAgent takes from its base agent (the rest of an Agent's fields are its own).
SPECIALISED_FIELDS = ("llm_config", "system_prompt", "tools", "toolboxes", "human_in_the_loop", "transforms")


class SpecializedAgent(Agent):
    """An Agent specialised for a task, as the specification defines it: its base `agent` with the
    parameters' `additional_instructions` after its system prompt, their `additional_tools` after
    its tools, their `human_in_the_loop` (unless null) for its own, and inputs and outputs the
    union of both. Those fields are filled in when the document is read, so a SpecializedAgent
    runs wherever an Agent does; `agent` and `agent_specialization_parameters` stay as written."""

    component_type: Literal["SpecializedAgent"] = "SpecializedAgent"  # type: ignore[assignment]
    agent: Agent
    agent_specialization_parameters: AgentSpecializationParameters

    @model_validator(mode="before")
    @classmethod
    def _specialise(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        base, params = data.get("agent"), data.get("agent_specialization_parameters")
        if not isinstance(base, dict) or not isinstance(params, dict):
            return data  # the fields' own validation names what is wrong
        written = [key for key in SPECIALISED_FIELDS if key in data]
        if written:
            raise ValueError(f"SpecializedAgent {data.get('name')!r}: {', '.join(written)} come from its agent and "
                             "agent_specialization_parameters; remove them from the SpecializedAgent")
        return {**data, **specialised_fields(base, params, name=str(data.get("name") or ""),
                                             inputs=data.get("inputs"), outputs=data.get("outputs"))}


# --------------------------------------------------------------------------- multi-agent: Swarm, ManagerWorkers
# Agents that talk to each other, as the specification defines them (heddle.engine.multiagent runs
# them). A Swarm's agents ask each other along its `relationships` (caller, recipient) and may hand
# the user's conversation over; a ManagerWorkers' manager talks with the user and asks its workers.
# The specification leaves how agents reach each other to the runtime: heddle gives them the tools
# `send_message(recipient, message)` and `handoff_conversation(recipient)`, as the reference runtime
# does. An agent is named by its `name` there, so the names of a group's agents are unique.

SEND_MESSAGE = "send_message"
HANDOFF_CONVERSATION = "handoff_conversation"
HandoffMode = Literal["never", "optional", "always"]
_MEMBER_TYPES = ("Agent", "SpecializedAgent")

Member = Annotated[Agent | SpecializedAgent, Tagged("component_type")]


def _members_only(value: Any, where: str) -> Any:
    # A clearer refusal than the union's "does not match any of the expected tags".
    ctype = value.get("component_type") if isinstance(value, dict) else None
    if ctype in ("Swarm", "ManagerWorkers"):
        raise ValueError(f"{where} is a {ctype}: heddle runs a Swarm's or a ManagerWorkers' agents when they are "
                         "Agents or SpecializedAgents, not a multi-agent component inside another; give an Agent")
    if ctype == "A2AAgent":
        raise ValueError(f"{where} is an A2AAgent: the reference runtime takes only Agents as a Swarm's or a "
                         "ManagerWorkers' agents, and so does heddle; run the A2AAgent as the document's top level")
    return value


class _AgentGroup(WithIO):
    """What a Swarm and a ManagerWorkers share: agents, each once, named uniquely."""

    def members(self) -> list[tuple[str, Agent]]:
        """(field path from the group, agent) for each of its agents once, in document order."""
        raise NotImplementedError

    def member(self, name: str) -> Agent:
        return next(agent for _, agent in self.members() if agent.name == name)

    def _label(self) -> str:
        return f"{self.component_type} {self.name!r}"  # type: ignore[attr-defined]

    def _canonical(self, placed: list[tuple[str, Agent]]) -> dict[str, Agent]:
        """One agent per name (the first place it is written); refuses nameless agents and two
        different agents of one name (a reference written twice is one agent)."""
        label, found = self._label(), dict[str, Agent]()
        for where, agent in placed:
            if not agent.name:
                raise ValueError(f"{label}: the agent at {where} has no name; the agents of a {self.component_type} "  # type: ignore[attr-defined]
                                 "reach each other by name, give it one")
            seen = found.setdefault(agent.name, agent)
            if seen is not agent and seen.model_dump() != agent.model_dump():
                raise ValueError(f"{label}: two different agents are named {agent.name!r} (one at {where}); the "
                                 "agents reach each other by name, so give each its own")
        return found

    def _check_members(self) -> None:
        from heddle.agentspec import io

        label, types = self._label(), dict[str, tuple[str, set[str]]]()
        for where, agent in self.members():
            if agent.transforms:
                raise ValueError(f"{label}: the agent at {where} has transforms, which heddle applies to an Agent "
                                 "on its own, not yet to one of a group; remove them or run the agent alone")
            for prop in io.agent_inputs(agent):
                first = types.setdefault(prop["title"], (where, schema_types(prop)))
                if first[1] != schema_types(prop):
                    raise ValueError(f"{label}: input {prop['title']!r} of the agent at {where} has another type than "
                                     f"the one of the agent at {first[0]}; the group's agents share its inputs, so "
                                     "give it one type (or rename one)")


class Swarm(_AgentGroup):
    """Agents that ask each other along `relationships` ((caller, recipient) pairs): `first_agent`
    talks with the user first; with `handoff` another may take the user's conversation over."""

    component_type: Literal["Swarm"] = "Swarm"
    first_agent: Member
    relationships: list[Annotated[list[Member], Field(min_length=2, max_length=2)]]
    # never: send_message only; optional: both tools (only the agent talking with the user hands
    # over); always: handoff_conversation only. A boolean is the specification's older spelling.
    handoff: bool | HandoffMode = "optional"

    _first = field_validator("first_agent", mode="before")(
        classmethod(lambda cls, v: _members_only(v, "first_agent")))

    @field_validator("relationships", mode="before")
    @classmethod
    def _pairs(cls, value: Any) -> Any:
        for i, pair in enumerate(value if isinstance(value, list) else []):
            for j, agent in enumerate(pair if isinstance(pair, list) else []):
                _members_only(agent, f"relationships[{i}][{j}]")
        return value

    @field_validator("handoff", mode="before")
    @classmethod
    def _handoff(cls, value: Any) -> Any:
        if not isinstance(value, bool) and value not in ("never", "optional", "always"):
            raise ValueError(f"handoff must be 'never', 'optional' or 'always' (or a boolean, the specification's "
                             f"older spelling of 'optional' and 'never'), not {value!r}")
        return value

    def handoff_mode(self) -> HandoffMode:
        if isinstance(self.handoff, bool):
            return "optional" if self.handoff else "never"
        return self.handoff

    def members(self) -> list[tuple[str, Agent]]:
        placed: dict[str, tuple[str, Agent]] = {self.first_agent.name: ("first_agent", self.first_agent)}
        for i, pair in enumerate(self.relationships):
            for j, agent in enumerate(pair):
                placed.setdefault(agent.name, (f"relationships[{i}][{j}]", agent))
        return list(placed.values())

    def recipients(self, name: str) -> list[Agent]:
        """The agents the agent `name` may ask (or hand over to), in the order of the relationships."""
        return [recipient for caller, recipient in self.relationships if caller.name == name]

    @model_validator(mode="after")
    def _check_swarm(self) -> "Swarm":
        label = self._label()
        if not self.relationships:
            raise ValueError(f"{label}: relationships is empty, so its agents could never reach each other; list "
                             "(caller, recipient) pairs, or use an Agent")
        placed = [("first_agent", self.first_agent)] + [(f"relationships[{i}][{j}]", agent)
                                                         for i, pair in enumerate(self.relationships)
                                                         for j, agent in enumerate(pair)]
        canonical = self._canonical(placed)
        seen: set[tuple[str, str]] = set()
        for i, (caller, recipient) in enumerate(self.relationships):
            if caller.name == recipient.name:
                raise ValueError(f"{label}: relationships[{i}] has agent {caller.name!r} ask itself; remove it")
            if (caller.name, recipient.name) in seen:
                raise ValueError(f"{label}: relationships[{i}] ({caller.name!r}, {recipient.name!r}) is listed twice; "
                                 "remove one")
            seen.add((caller.name, recipient.name))
        # Each agent one object, wherever the document writes it: walks see its tools and model once.
        self.first_agent = canonical[self.first_agent.name]
        self.relationships = [[canonical[a.name], canonical[b.name]] for a, b in self.relationships]
        mode = self.handoff_mode()
        names = ([SEND_MESSAGE] if mode != "always" else []) + ([HANDOFF_CONVERSATION] if mode != "never" else [])
        for _, agent in self.members():
            if self.recipients(agent.name):
                _no_tool_named(label, agent, names)
        self._check_members()
        return self


class ManagerWorkers(_AgentGroup):
    """`group_manager` talks with the user and asks its `workers` (send_message), whose answers come
    back to it."""

    component_type: Literal["ManagerWorkers"] = "ManagerWorkers"
    group_manager: Member
    workers: list[Member]

    _manager = field_validator("group_manager", mode="before")(
        classmethod(lambda cls, v: _members_only(v, "group_manager")))

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        for i, agent in enumerate(value if isinstance(value, list) else []):
            _members_only(agent, f"workers[{i}]")
        return value

    def members(self) -> list[tuple[str, Agent]]:
        return [("group_manager", self.group_manager), *((f"workers[{i}]", w) for i, w in enumerate(self.workers))]

    @model_validator(mode="after")
    def _check_manager_workers(self) -> "ManagerWorkers":
        label = self._label()
        if not self.workers:
            raise ValueError(f"{label}: workers is empty; give it at least one worker, or use an Agent")
        names: dict[str, str] = {}
        for where, agent in self.members():
            if not agent.name:
                raise ValueError(f"{label}: the agent at {where} has no name; the manager reaches its workers by "
                                 "name, give it one")
            first = names.setdefault(agent.name, where)
            if first != where:
                raise ValueError(f"{label}: the agents at {first} and {where} are both named {agent.name!r}; the "
                                 "manager reaches its workers by name (and is not one of them), so give each its own")
        _no_tool_named(label, self.group_manager, [SEND_MESSAGE])
        self._check_members()
        return self


def _no_tool_named(label: str, agent: Agent, names: list[str]) -> None:
    for tool in agent.tools:
        if tool.name in names:
            raise ValueError(f"{label}: agent {agent.name!r} has a tool named {tool.name!r}, the name of the tool "
                             "heddle gives it to reach the group's other agents; rename the tool")


Agentic = Agent | SpecializedAgent | Swarm | ManagerWorkers
"""What may be a document's top level as an agent, or an AgentNode's agent."""

MULTI_AGENT = (Swarm, ManagerWorkers)


# --------------------------------------------------------------------------- A2AAgent
# An agent served elsewhere over the A2A protocol (heddle.engine.a2a talks to it). The reference
# runtime runs one as a conversation of its own, at a document's top level; an AgentNode refuses it
# there, and so does heddle (AgentNode below). Every field is honoured or refused by name.


class A2ASessionParameters(BaseModel):
    """How long heddle polls the remote task, how often, and how many failed polls in a row it takes."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    timeout: float = Field(default=60.0, gt=0)
    poll_interval: float = Field(default=2.0, gt=0)
    max_retries: int = Field(default=5, ge=0)


class A2AConnectionConfig(Component):
    component_type: Literal["A2AConnectionConfig"] = "A2AConnectionConfig"
    timeout: float = Field(default=600.0, gt=0)  # each HTTP request's
    headers: dict[str, str] | None = None  # a value `$NAME` is read from the environment where the run starts
    verify: bool = True
    key_file: str | None = None
    cert_file: str | None = None
    ssl_ca_cert: str | None = None
    retry_policy: Any = None

    @model_validator(mode="after")
    def _check_connection(self) -> "A2AConnectionConfig":
        label = f"A2AConnectionConfig {self.name!r}"
        if self.retry_policy is not None:
            raise ValueError(f"{label}: retry_policy is not supported by heddle yet; drop it (session_parameters' "
                             "max_retries still retries a failed poll)")
        files = [f for f in ("key_file", "cert_file", "ssl_ca_cert") if getattr(self, f)]
        if not self.verify and files:
            raise ValueError(f"{label}: verify is false and {files[0]} is given; give the certificate files or "
                             "verify: false, not both")
        if bool(self.key_file) != bool(self.cert_file):
            raise ValueError(f"{label}: key_file and cert_file go together (mutual TLS); give both or neither")
        for header, value in (self.headers or {}).items():
            if value.startswith("$") and env_reference(value) is None:
                raise ValueError(f"{label}: headers {header!r} value {value!r} is not a valid environment variable "
                                 "reference; write it as $NAME")
        return self


class A2AAgent(WithIO):
    """An agent served at `agent_url` over A2A: each user message goes to it, its answer is the turn's."""

    component_type: Literal["A2AAgent"] = "A2AAgent"
    agent_url: str
    connection_config: A2AConnectionConfig
    session_parameters: A2ASessionParameters = Field(default_factory=A2ASessionParameters)

    @model_validator(mode="after")
    def _check_a2a(self) -> "A2AAgent":
        label = f"A2AAgent {self.name!r}"
        if url_origin(self.agent_url) is None:
            raise ValueError(f"{label}: agent_url {self.agent_url!r} must be an http:// or https:// URL whose host "
                             "the document writes out (credentials go in connection_config.headers as $VAR)")
        for field in ("inputs", "outputs"):
            if getattr(self, field):
                raise ValueError(f"{label}: it declares {field}, which the reference runtime does not pass to or take "
                                 f"from the remote agent (its answer is the turn's message); remove {field}")
        return self


def agents_of(agentic: Agentic | A2AAgent) -> list[Agent]:
    """The agents an agentic component runs here: itself, or a group's agents (each once); none for an
    A2AAgent, which runs elsewhere."""
    if isinstance(agentic, A2AAgent):
        return []
    if isinstance(agentic, MULTI_AGENT):
        return [agent for _, agent in agentic.members()]
    return [agentic]


# --------------------------------------------------------------------------- nodes


class NodeBase(WithIO):
    branches: list[str] | None = None  # as written; checked against next_branches() as pyagentspec checks it

    def next_branches(self) -> list[str]:
        """The branches this node can leave by. Most nodes have one: `next`."""
        return ["next"]

    @model_validator(mode="after")
    def _check_branches(self) -> "NodeBase":
        # pyagentspec's rule: written branches are the node's own (an AgentNode's may be any; a
        # plugin's node has its manifest's), without repeats.
        written = self.branches or []
        label = f"{self.component_type} {self.name!r}"  # type: ignore[attr-defined]
        if len(written) != len(set(written)):
            raise ValueError(f"{label}: branches {written} name a branch twice; name each once")
        if not written or isinstance(self, (AgentNode, PluginNode)):
            return self
        inferred = set(self.next_branches())
        if isinstance(self, BranchingNode):  # the specification's: `default` always, beside the mapping's
            inferred = {"default", *self.mapping.values()}
        if set(written) != inferred:
            raise ValueError(f"{label}: branches {written} are not the branches it has ({sorted(inferred)}); "
                             "write those, or leave branches out")
        return self


class StartNode(NodeBase):
    component_type: Literal["StartNode"] = "StartNode"


class EndNode(NodeBase):
    component_type: Literal["EndNode"] = "EndNode"
    branch_name: str | None = None

    def next_branches(self) -> list[str]:
        return []


class ToolNode(NodeBase):
    component_type: Literal["ToolNode"] = "ToolNode"
    tool: Tool


class LlmNode(NodeBase):
    component_type: Literal["LlmNode"] = "LlmNode"
    llm_config: LlmConfig
    prompt_template: str


class AgentNode(NodeBase):
    component_type: Literal["AgentNode"] = "AgentNode"
    # An A2AAgent only as the document's top level (heddle.agentspec.roots builds its node from the model).
    agent: Annotated[Agentic | A2AAgent, Tagged("component_type")]

    @model_validator(mode="before")
    @classmethod
    def _no_a2a(cls, data: Any) -> Any:
        agent = data.get("agent") if isinstance(data, dict) else None
        if isinstance(agent, dict) and agent.get("component_type") == "A2AAgent":
            raise ValueError(f"AgentNode {data.get('name')!r}: its agent is an A2AAgent, which the reference runtime "
                             "refuses in an AgentNode (it runs one only as a conversation of its own); run the "
                             "A2AAgent as the document's top level")
        return data


class BranchingNode(NodeBase):
    component_type: Literal["BranchingNode"] = "BranchingNode"
    mapping: dict[str, str] = Field(default_factory=_dict)

    def next_branches(self) -> list[str]:
        # Without a DEFAULT_BRANCH entry an unmapped value leaves by "default".
        names = list(self.mapping.values())
        if "DEFAULT_BRANCH" not in self.mapping:
            names.append("default")
        return list(dict.fromkeys(names))


class FlowNode(NodeBase):
    component_type: Literal["FlowNode"] = "FlowNode"
    subflow: "Flow"

    def next_branches(self) -> list[str]:
        # One per branch_name of the subflow's EndNodes (`next` when they name none).
        ends = [n.branch_name or "next" for n in self.subflow.nodes if isinstance(n, EndNode)]
        return sorted(set(ends)) or ["next"]


class ApiNode(NodeBase):
    """The HTTP request of a node, its url, method, query, headers and body templated from the node's
    inputs (heddle.engine.api sends it, with a RemoteTool's rules). Inputs it does not declare are
    inferred from its `{{placeholders}}`; outputs it does not declare are one, `response`, as the
    specification says."""

    component_type: Literal["ApiNode"] = "ApiNode"
    url: str
    http_method: str
    api_spec_uri: str | None = None  # describes the API; heddle never fetches it
    data: Any = Field(default_factory=_dict)
    query_params: dict[str, Any] = Field(default_factory=_dict)
    headers: dict[str, Any] = Field(default_factory=_dict)
    sensitive_headers: dict[str, Any] = Field(default_factory=_dict)
    url_allow_list: list[str] | None = None
    retry_policy: Any = None

    _empty = field_validator("query_params", "headers", "sensitive_headers", mode="before")(
        classmethod(lambda cls, v: _none_is_empty_dict(v))
    )

    @model_validator(mode="after")
    def _check_api_node(self) -> "ApiNode":
        if "inputs" not in self.model_fields_set:
            self.inputs = inferred_inputs(self)
        if "outputs" not in self.model_fields_set:
            self.outputs = [{"title": DEFAULT_OUTPUT}]
        check_definition(self)
        check_outputs(self)
        return self


class PluginNode(NodeBase):
    """A node of a type a loaded plugin declares; the plugin's process executes it.

    The document reader admits such a type only when a plugin declaring it is loaded. Fields
    beyond the common ones are the node's own properties, passed to the plugin as they are.
    """

    component_type: str
    llm_config: LlmConfig | None = None


# --------------------------------------------------------------------------- composite nodes
# MapNode, ParallelMapNode, ParallelFlowNode, CatchExceptionNode: nodes that run subflows
# (heddle.engine.composite executes them). Their inputs and outputs are inferred from the
# subflows as the specification says; what a document declares must name the same values.

Reducer = Literal["append", "sum", "average", "max", "min"]
NUMERIC_REDUCERS: tuple[str, ...] = ("sum", "average", "max", "min")
ITERATED_PREFIX = "iterated_"
COLLECTED_PREFIX = "collected_"
CAUGHT_EXCEPTION_BRANCH = "caught_exception_branch"
CAUGHT_EXCEPTION_INFO = "caught_exception_info"


def schema_types(schema: Property) -> set[str]:
    """The JSON types a property admits; {"any"} when it does not say."""
    found: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        found.add(declared)
    elif isinstance(declared, list):
        found.update(t for t in declared if isinstance(t, str))
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            if isinstance(option, dict):
                found |= schema_types(option)
    return found or {"any"}


def flow_inputs(flow: "Flow") -> list[Property]:
    # io reads these classes: a subflow's inputs and outputs are its nodes', the recursion pyproject's
    # import contract names (here, in flow_outputs and in _AgentGroup._check_members).
    from heddle.agentspec import io

    return io.flow_inputs(flow)


def flow_outputs(flow: "Flow") -> list[Property]:
    from heddle.agentspec import io

    return io.flow_outputs(flow)


def flow_branches(flow: "Flow") -> list[str]:
    """The branches a flow can end by: one per distinct EndNode `branch_name` ("next" when unnamed)."""
    names = [n.branch_name or "next" for n in flow.nodes if isinstance(n, EndNode)]
    return list(dict.fromkeys(names)) or ["next"]


def _strip(schema: Property) -> Property:
    """A schema without the annotations that do not change what it admits."""
    return {k: v for k, v in schema.items() if k not in ("title", "description", "default")}


def _check_declared(node: NodeBase, kind: str, declared: list[Property], inferred: list[Property]) -> None:
    # The specification: declared inputs/outputs must name the inferred ones (a declaration may refine types).
    names, expected = {p["title"] for p in declared}, {p["title"] for p in inferred}
    if declared and names != expected:
        extra, missing = sorted(names - expected), sorted(expected - names)
        detail = "; ".join(part for part in (
            f"it declares {', '.join(map(repr, extra))}, which are not among them" if extra else "",
            f"it does not declare {', '.join(map(repr, missing))}" if missing else "") if part)
        raise ValueError(f"{type(node).__name__} {node.name!r}: its {kind} must be {sorted(expected)} as "
                         f"inferred from its subflow; {detail}")


class _MapNodeBase(NodeBase):
    subflow: "Flow"
    reducers: dict[str, Reducer] | None = None

    def reducer_of(self) -> dict[str, str]:
        """Reducer by subflow output title; without `reducers`, every output is appended."""
        if self.reducers is None:
            return {p["title"]: "append" for p in flow_outputs(self.subflow)}
        return dict(self.reducers)

    def inferred_inputs(self) -> list[Property]:
        return [{"title": ITERATED_PREFIX + p["title"],
                 "anyOf": [_strip(p), {"type": "array", "items": _strip(p)}]} for p in flow_inputs(self.subflow)]

    def inferred_outputs(self) -> list[Property]:
        reducers, out = self.reducer_of(), []
        for prop in flow_outputs(self.subflow):
            method = reducers.get(prop["title"])
            if method is None:
                continue
            title = COLLECTED_PREFIX + prop["title"]
            out.append({"title": title, "type": "array", "items": _strip(prop)} if method == "append"
                       else {**_strip(prop), "title": title})
        return out

    @model_validator(mode="after")
    def _check_map(self) -> "_MapNodeBase":
        label = f"{type(self).__name__} {self.name!r}"
        outputs = {p["title"]: p for p in flow_outputs(self.subflow)}
        for title, method in (self.reducers or {}).items():
            prop = outputs.get(title)
            if prop is None:
                raise ValueError(f"{label}: reducer {title!r} names no output of "
                                 f"its subflow (outputs: {sorted(outputs)}); reducers use the subflow's own "
                                 f"output names, without {COLLECTED_PREFIX!r}")
            if method in NUMERIC_REDUCERS and not schema_types(prop) <= {"integer", "number"}:
                raise ValueError(f"{label}: reducer {method!r} of {title!r} needs an "
                                 f"integer or number output, not {'/'.join(sorted(schema_types(prop)))}; "
                                 "use 'append'")
        _check_declared(self, "inputs", self.inputs, self.inferred_inputs())
        _check_declared(self, "outputs", self.outputs, self.inferred_outputs())
        return self


class MapNode(_MapNodeBase):
    """Runs `subflow` once per element of its `iterated_*` list inputs, one after another, and reduces
    each subflow output into its `collected_*` output."""

    component_type: Literal["MapNode"] = "MapNode"


class ParallelMapNode(_MapNodeBase):
    """A MapNode whose runs of the subflow happen concurrently (at most --max-parallel at once)."""

    component_type: Literal["ParallelMapNode"] = "ParallelMapNode"


class ParallelFlowNode(NodeBase):
    """Runs every subflow concurrently (at most --max-parallel at once); its outputs are the union of theirs."""

    component_type: Literal["ParallelFlowNode"] = "ParallelFlowNode"
    subflows: "list[Flow]" = Field(default_factory=_list)

    def inferred_inputs(self) -> list[Property]:
        merged: dict[str, Property] = {}
        for flow in self.subflows:
            for prop in flow_inputs(flow):
                merged.setdefault(prop["title"], prop)
        return list(merged.values())

    def inferred_outputs(self) -> list[Property]:
        return [p for flow in self.subflows for p in flow_outputs(flow)]

    @model_validator(mode="after")
    def _check_parallel(self) -> "ParallelFlowNode":
        inputs: dict[str, tuple[int, Property]] = {}
        outputs: dict[str, int] = {}
        label = f"ParallelFlowNode {self.name!r}"
        for i, flow in enumerate(self.subflows):
            for prop in flow_inputs(flow):
                j, seen = inputs.setdefault(prop["title"], (i, prop))
                if schema_types(seen) != schema_types(prop):
                    raise ValueError(f"{label}: subflows[{j}] {self.subflows[j].name!r} and subflows[{i}] "
                                     f"{flow.name!r} both take input {prop['title']!r}, with different types; "
                                     "rename one of them")
            for prop in flow_outputs(flow):
                j = outputs.setdefault(prop["title"], i)
                if j != i:
                    raise ValueError(f"{label}: subflows[{j}] {self.subflows[j].name!r} and subflows[{i}] "
                                     f"{flow.name!r} both give output {prop['title']!r}; the outputs of parallel "
                                     "subflows must have distinct names")
        _check_declared(self, "inputs", self.inputs, self.inferred_inputs())
        _check_declared(self, "outputs", self.outputs, self.inferred_outputs())
        return self


class CatchExceptionNode(NodeBase):
    """Runs `subflow`; a failure in it leaves by `caught_exception_branch` with the outputs' defaults and
    `caught_exception_info` set, success by the subflow's own branch with its outputs."""

    component_type: Literal["CatchExceptionNode"] = "CatchExceptionNode"
    subflow: "Flow"

    def next_branches(self) -> list[str]:
        return [CAUGHT_EXCEPTION_BRANCH, *flow_branches(self.subflow)]

    def inferred_inputs(self) -> list[Property]:
        return list(flow_inputs(self.subflow))

    def inferred_outputs(self) -> list[Property]:
        node_outputs = [p for p in self.outputs if p["title"] != CAUGHT_EXCEPTION_INFO]
        return [*(node_outputs or flow_outputs(self.subflow)),
                {"title": CAUGHT_EXCEPTION_INFO, "anyOf": [{"type": "string"}, {"type": "null"}], "default": None}]

    def output_defaults(self) -> dict[str, Any]:
        """The value of each output when the subflow failed: declared here, else on the subflow's output."""
        sub = {p["title"]: p for p in flow_outputs(self.subflow)}
        values: dict[str, Any] = {}
        for prop in self.inferred_outputs():
            title = prop["title"]
            if "default" in prop:
                values[title] = prop["default"]
            elif "default" in sub.get(title, {}):
                values[title] = sub[title]["default"]
        return values

    @model_validator(mode="after")
    def _check_catch(self) -> "CatchExceptionNode":
        label = f"CatchExceptionNode {self.name!r}"
        if CAUGHT_EXCEPTION_BRANCH in flow_branches(self.subflow):
            raise ValueError(f"{label}: an EndNode of its subflow is named {CAUGHT_EXCEPTION_BRANCH!r}, the "
                             "branch a caught failure takes; rename that branch_name")
        if any(p["title"] == CAUGHT_EXCEPTION_INFO for p in flow_outputs(self.subflow)):
            raise ValueError(f"{label}: its subflow has an output named {CAUGHT_EXCEPTION_INFO!r}, which this "
                             "node gives itself; rename that output")
        _check_declared(self, "inputs", self.inputs, self.inferred_inputs())
        # caught_exception_info may go undeclared: the node gives it anyway
        _check_declared(self, "outputs", [p for p in self.outputs if p["title"] != CAUGHT_EXCEPTION_INFO],
                        flow_outputs(self.subflow))
        defaults = self.output_defaults()
        for prop in self.inferred_outputs():
            if prop["title"] not in defaults:
                raise ValueError(f"{label}: output {prop['title']!r} has no default, which it must give when the "
                                 "subflow fails; add a `default` to it here or on the subflow's output")
        return self


COMPOSITE_NODES = (MapNode, ParallelMapNode, ParallelFlowNode, CatchExceptionNode)

# --------------------------------------------------------------------------- InputMessageNode
# Waits for the user's message (in a session: heddle.engine.journal), which becomes its one output.

INPUT_MESSAGE_OUTPUT = "user_input"


class InputMessageNode(NodeBase):
    """Shows `message` (when given, its placeholders filled from its inputs) and waits for the user's
    reply: its one string output, `user_input` unless the node declares another."""

    component_type: Literal["InputMessageNode"] = "InputMessageNode"
    message: str | None = None

    @model_validator(mode="after")
    def _check_input_message(self) -> "InputMessageNode":
        if len(self.outputs) > 1 or any(p.get("type", "string") != "string" for p in self.outputs):
            raise ValueError(f"InputMessageNode {self.name!r}: its outputs may only be one string property (the "
                             "user's message)")
        return self


# --------------------------------------------------------------------------- messages
# OutputMessageNode: shows its `message`, placeholders filled from its inputs, to the person running
# the flow (heddle.engine.nodes runs it; heddle.agentspec.messages says how a run without a chat window
# shows it).

class OutputMessageNode(NodeBase):
    """Appends `message` to the conversation as the agent's: one input per placeholder, no outputs."""

    component_type: Literal["OutputMessageNode"] = "OutputMessageNode"
    message: str

    @model_validator(mode="after")
    def _check_output_message(self) -> "OutputMessageNode":
        label = f"OutputMessageNode {self.name!r}"
        if self.outputs:
            raise ValueError(f"{label}: it declares outputs {self.output_titles()}, but an OutputMessageNode gives "
                             "none (it shows its message); remove them")
        return self


_BUILTIN_NODES = ("StartNode", "EndNode", "ToolNode", "LlmNode", "AgentNode", "BranchingNode", "FlowNode",
                  "ApiNode", "MapNode", "ParallelMapNode", "ParallelFlowNode", "CatchExceptionNode",
                  "InputMessageNode", "OutputMessageNode")


def _node_tag(value: Any) -> str | None:
    ctype = value.get("component_type") if isinstance(value, dict) else getattr(value, "component_type", None)
    if ctype is None or ctype in _BUILTIN_NODES:
        return ctype
    return "PluginNode"


Node = Annotated[
    Annotated[StartNode, Tag("StartNode")]
    | Annotated[EndNode, Tag("EndNode")]
    | Annotated[ToolNode, Tag("ToolNode")]
    | Annotated[LlmNode, Tag("LlmNode")]
    | Annotated[AgentNode, Tag("AgentNode")]
    | Annotated[BranchingNode, Tag("BranchingNode")]
    | Annotated[FlowNode, Tag("FlowNode")]
    | Annotated[ApiNode, Tag("ApiNode")]
    | Annotated[MapNode, Tag("MapNode")]
    | Annotated[ParallelMapNode, Tag("ParallelMapNode")]
    | Annotated[ParallelFlowNode, Tag("ParallelFlowNode")]
    | Annotated[CatchExceptionNode, Tag("CatchExceptionNode")]
    | Annotated[InputMessageNode, Tag("InputMessageNode")]
    | Annotated[OutputMessageNode, Tag("OutputMessageNode")]
    | Annotated[PluginNode, Tag("PluginNode")],
    Tagged(_node_tag),
]

# --------------------------------------------------------------------------- edges and flow


class ControlFlowEdge(Component):
    component_type: Literal["ControlFlowEdge"] = "ControlFlowEdge"
    from_node: Node
    from_branch: str | None = None
    to_node: Node


class DataFlowEdge(Component):
    component_type: Literal["DataFlowEdge"] = "DataFlowEdge"
    source_node: Node
    source_output: str
    destination_node: Node
    destination_input: str


class Flow(WithIO):
    component_type: Literal["Flow"] = "Flow"
    agentspec_version: str | None = None
    start_node: Node
    nodes: list[Node] = Field(default_factory=_list)
    control_flow_connections: list[ControlFlowEdge] = Field(default_factory=_list)
    data_flow_connections: list[DataFlowEdge] | None = None
    # What the document's top level was (a heddle.agentspec.roots.DocumentRoot): the Flow heddle runs may
    # stand for an Agent or a single node. Never serialised; set by the document reader.
    _root: Any = PrivateAttr(default=None)
    # The compiled check of its StartNode's inputs (heddle.engine.inputs), kept with the flow it
    # was made from, as a server checks every request of a flow against it.
    _input_check: Any = PrivateAttr(default=None)

    @field_validator("nodes", "control_flow_connections", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


KNOWN_COMPONENT_TYPES: tuple[str, ...] = (
    "Flow",
    "StartNode",
    "EndNode",
    "ToolNode",
    "AgentNode",
    "LlmNode",
    "BranchingNode",
    "FlowNode",
    "ApiNode",
    "MapNode",
    "ParallelMapNode",
    "ParallelFlowNode",
    "CatchExceptionNode",
    "InputMessageNode",
    "OutputMessageNode",
    "Agent",
    "SpecializedAgent",
    "AgentSpecializationParameters",
    "Swarm",
    "ManagerWorkers",
    "ServerTool",
    "RemoteTool",
    "ClientTool",
    "BuiltinTool",
    "MCPTool",
    "MCPToolBox",
    "MCPToolSpec",
    "StdioTransport",
    "SSETransport",
    "SSEmTLSTransport",
    "StreamableHTTPTransport",
    "StreamableHTTPmTLSTransport",
    "ControlFlowEdge",
    "DataFlowEdge",
    "A2AAgent",
    "A2AConnectionConfig",
    "OpenAiConfig",
    "OpenAiCompatibleConfig",
    "VllmConfig",
    "OllamaConfig",
    "GeminiConfig",
    "GeminiAIStudioAuthConfig",
    "MessageSummarizationTransform",
    "ConversationSummarizationTransform",
    "InMemoryCollectionDatastore",
    "PostgresDatabaseDatastore",
    "TlsPostgresDatabaseConnectionConfig",
)
