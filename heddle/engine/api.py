"""ApiNode: the HTTP request of a node, made and read as the reference runtime (WayFlow's ApiCallStep) does.

The request is a RemoteTool's (heddle.tools.remote builds and sends both: the url's host is the
document's own, headers read from the environment only as `$VAR`, redirects on that host only,
`url_allow_list` checked at each hop, the body read within `--max-response-bytes` once decoded),
filled from the node's inputs as WayFlow fills it (remote.build_request says how).

What WayFlow does with the answer:
- A status other than 2xx is asked again, at once, up to `ATTEMPTS` requests in all; the last such
  answer fails the node.
- A node that declares no outputs has one, `response` (the specification's default). Each declared
  output is read from the answer's JSON object by its title (the jq query `.TITLE`): a key the
  object lacks, or holds as null, gives no value (WayFlow drops a null output), so the output's
  default applies, else the run fails naming it; an answer that is not JSON, or is JSON but not an
  object, fails the node. Two titles are the answer's own: `http_status_code` is its status, and
  `http_response` declared as a string is its text. A node whose outputs are `[]` reads nothing.
- Each value must fit its output's declared type, or the node fails naming both (WayFlow passes it
  on as it is; heddle never gives a value its declaration does not admit).

In a session the request is a step (heddle.engine.journal), sent with its idempotency key as the
`Idempotency-Key` header: a run that resumes does not send an answered request again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heddle.bounded import ACCEPT_ENCODING
from heddle.engine.journal import Call, ToolDone, ToolFailed, call_fingerprint
from heddle.engine.tracing import REQUEST_HOOKS
from heddle.errors import NodeOverrun, RunError, ToolError, UsageError
from heddle.lazytls import LazyTLSTransport
from heddle.safeparse import loads_json
from heddle.tools.remote import (
    ATTEMPTS,
    _excerpt,
    _fits,
    _types,
    build_request,
    header_secrets,
    send_asking_again,
    with_idempotency_key,
)

if TYPE_CHECKING:
    from heddle.agentspec import components as c
    from heddle.engine.context import RunContext
    from heddle.engine.seams import Outcome
    from heddle.tools.remote import Answer

STATUS_OUTPUT = "http_status_code"
TEXT_OUTPUT = "http_response"


def _label(node: c.ApiNode) -> str:
    return f"ApiNode {node.name!r}"


def _text_output(prop: dict[str, Any]) -> bool:
    return prop["title"] == TEXT_OUTPUT and prop.get("type") == "string"


def read_outputs(node: c.ApiNode, answer: Answer) -> dict[str, Any]:
    """The node's outputs from a 2xx answer."""
    if not node.outputs:
        return {}
    text = answer.text()
    try:
        value = loads_json(text)
    except ValueError:
        raise RunError(f"{_label(node)}: {answer.method} {answer.url} answered {_excerpt(text)}, which is not JSON; "
                       f"its outputs ({', '.join(node.output_titles())}) are read from a JSON object") from None
    if value is not None and not isinstance(value, dict):
        raise RunError(f"{_label(node)}: {answer.method} {answer.url} answered a JSON {type(value).__name__}, not an "
                       f"object; its outputs ({', '.join(node.output_titles())}) are read from its keys")
    out: dict[str, Any] = {}
    for prop in node.outputs:
        title = prop["title"]
        if title == STATUS_OUTPUT:
            item: Any = answer.status
        elif _text_output(prop):
            item = text
        else:
            item = None if value is None else value.get(title)
            if item is None:
                continue  # WayFlow's null is a value not given: a default downstream applies
        if not _fits(prop, item):
            raise RunError(f"{_label(node)}: output {title!r} is declared {_types(prop)}, and the answer gives "
                           f"{_excerpt(str(item))}")
        out[title] = item
    return out


async def api_node(ctx: RunContext, node: c.ApiNode, inputs: dict[str, Any]) -> Outcome:
    journal = ctx.journal
    if journal is None:
        return await _call(ctx, node, inputs, None), None
    # In a session the request is a step (heddle.engine.journal): sent once, its answer kept.
    key = journal.key("h")
    call = Call("api", node.name, call_fingerprint(node.name, inputs))
    found = journal.replayed(key, call)
    if isinstance(found, ToolFailed):
        raise RunError(found.error)
    if isinstance(found, ToolDone):
        return dict(found.output), None
    await journal.begin(key, call)
    try:
        outputs = await _call(ctx, node, inputs, journal.idempotency_key(key))
    except RunError as exc:
        if not isinstance(exc, NodeOverrun):
            await journal.fail(key, ToolFailed(call="api", name=call.name, fingerprint=call.fingerprint,
                                               error=str(exc)), exc)
        raise
    await journal.done(key, ToolDone(call="api", name=call.name, fingerprint=call.fingerprint, output=outputs))
    return outputs, None


async def _call(ctx: RunContext, node: c.ApiNode, inputs: dict[str, Any], idempotency_key: str | None
                ) -> dict[str, Any]:
    import httpx


    options = ctx.options
    if options.sandbox.deny_net:
        raise UsageError(f"{_label(node)} sends a request over the network, and --deny-net gives the run no "
                         "network; run without --deny-net to let it")
    secrets = header_secrets(node, f"node {node.name!r}")
    arguments = {p["title"]: inputs[p["title"]] for p in node.inputs if p["title"] in inputs}
    try:
        outgoing = with_idempotency_key(build_request(node, arguments, secrets), idempotency_key)
    except ToolError as exc:
        raise RunError(f"{_label(node)}: {str(exc).removeprefix(f'tool {node.name!r}: ')}") from None

    def fail(message: str, overrun: bool) -> Exception:
        return (NodeOverrun if overrun else RunError)(f"{_label(node)}: {message}")


    async with httpx.AsyncClient(follow_redirects=False, timeout=httpx.Timeout(options.tool_timeout),
                                 transport=LazyTLSTransport(), event_hooks=dict(REQUEST_HOOKS),
                                 headers={"Accept-Encoding": ACCEPT_ENCODING}) as client:
        answer = await send_asking_again(client, outgoing, allow_list=node.url_allow_list,
                                         max_bytes=options.max_response_bytes, surface=options.surface, fail=fail,
                                         timeout=options.tool_timeout,
                                         overrun=lambda message: NodeOverrun(f"{_label(node)}: {message}"),
                                         egress=(options.egress, node.name))
    if answer.ok:
        return read_outputs(node, answer)
    raise RunError(f"{_label(node)}: {answer.method} {answer.url} answered HTTP {answer.status} {answer.reason} "
                   f"({ATTEMPTS} times, as the reference runtime asks): {_excerpt(answer.text())}")
