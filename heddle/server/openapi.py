"""The OpenAPI description of every route and body, served at `/openapi.json`.

Written out rather than generated: it is the contract clients and the fuzzing tests hold the
server to, so it changes only on purpose.
"""

from __future__ import annotations

from typing import Any

JSON = "application/json"


def _session_id_pattern() -> str:
    from heddle.sessions.store import _SESSION_ID

    return f"^{_SESSION_ID.pattern}$"


SESSION_ID_PATTERN = _session_id_pattern()


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


def _schemas() -> dict[str, Any]:
    tool = {
        "type": "object",
        "required": ["name", "source"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
            "source": {"type": "string", "minLength": 1, "description": "The tool's program text."},
            "interpreter": {"type": "string", "enum": ["sh", "bash", "python3", "node"]},
        },
    }
    flow_fields = {
        "flow": {"description": "An Agent Spec flow document: an object, or its JSON or YAML text.",
                 "oneOf": [{"type": "object"}, {"type": "string"}]},
        "flowPath": {"type": "string", "description": "A flow document's path under the server's --flows-root."},
        "tools": {"type": "array", "maxItems": 32, "items": _ref("RequestTool"),
                  "description": "Tools sent with the request (only with --allow-request-code)."},
    }
    session_id = {"type": "string", "pattern": SESSION_ID_PATTERN, "description": "A session id POST /v1/sessions "
                  "issued (the server chooses ids: at least 128 random bits)."}
    fingerprint = {"fingerprint": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$",
                                   "description": "The fingerprint of the call answered, as its wait shows it: "
                                   "when given, it must be the one the session waits on (else 409)."}}
    answer = {
        "description": "The person's answer to what the session's run waits for: exactly one of these.",
        "oneOf": [
            {"type": "object", "required": ["message"], "additionalProperties": False,
             "properties": {"message": {"type": "string", "description": "A reply (kind message)."}}},
            {"type": "object", "required": ["approve"], "additionalProperties": False,
             "properties": {"approve": {"type": "boolean", "enum": [True],
                                        "description": "Let the tool run (kind approval)."}, **fingerprint}},
            {"type": "object", "required": ["deny"], "additionalProperties": False,
             "properties": {"deny": {"type": "string", "description": "Refuse it, with the reason the model is "
                                     "told (kind approval)."}, **fingerprint}},
            {"type": "object", "required": ["tool_result"], "additionalProperties": False,
             "properties": {"tool_result": {"description": "A ClientTool's result, any JSON value (kind "
                                            "client_tool)."}, **fingerprint}},
        ],
    }
    waiting_for = {
        "type": "object", "required": ["kind", "node"],
        "properties": {"kind": {"type": "string", "enum": ["message", "approval", "client_tool"]},
                       "node": {"type": "string", "description": "The node that waits."},
                       "prompt": {"type": "string", "description": "The question shown with it."},
                       "tool": {"type": "string", "description": "The tool to approve or to run."},
                       "arguments": {"type": "object", "description": "The arguments it was called with."},
                       "fingerprint": {"type": "string", "description": "sha256 of the canonical JSON of the "
                                       "arguments: the answer is bound to it, and a call with other arguments "
                                       "never runs on it."}},
    }
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "object", "required": ["type", "message"],
                                     "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}},
        },
        "Health": {"type": "object", "required": ["status", "version"],
                   "properties": {"status": {"type": "string", "enum": ["ok", "draining"]},
                                  "version": {"type": "string"}}},
        "Ready": {"type": "object", "required": ["status"],
                  "properties": {"status": {"type": "string", "enum": ["ready", "draining"]}}},
        "RequestTool": tool,
        "RunRequest": {
            "type": "object",
            "additionalProperties": False,
            "description": "With a bundle, only 'inputs' (merged over the bundle's recorded input).",
            "properties": {**flow_fields,
                           "inputs": {"type": "object", "description": "The run's input."},
                           "message": {"type": "string", "description": "The user's message to the agent of a "
                                       "document whose top level is an agent (required there, refused for a flow). "
                                       "In a session whose run waits for a message, it is the answer."},
                           "session": {**session_id, "description": "Run as one turn of this session: the next "
                                       "turn of its conversation, or with 'answer' the run that waits (needs "
                                       "--session-store)."},
                           "answer": answer,
                           "resume": {"type": "boolean", "description": "With 'session': continue its run that "
                                      "was interrupted (a durable run), from its last checkpoint."}},
        },
        "Answer": answer,
        "WaitingFor": waiting_for,
        "Waiting": {"type": "object", "required": ["status", "session", "waiting_for", "messages"],
                    "description": "A run in a session stopped to wait for a person: answer it with a POST "
                                   "/v1/runs carrying the same session and an 'answer'.",
                    "properties": {"status": {"type": "string", "enum": ["waiting"]},
                                   "flow": {"type": "string"},
                                   "session": {"type": "string"},
                                   "waiting_for": _ref("WaitingFor"),
                                   "messages": {"type": "array", "items": {"type": "string"},
                                                "description": "The messages shown in this step, the question "
                                                               "last."}}},
        "SessionCreated": {"type": "object", "required": ["session"], "additionalProperties": False,
                           "properties": {"session": {"type": "string"}}},
        "SessionSummary": {
            "type": "object", "required": ["id", "status", "document", "digest", "turns", "created", "updated"],
            "description": "A session as its record says (never the run's checkpoint).",
            "properties": {"id": {"type": "string"},
                           "status": {"type": "string", "enum": ["idle", "waiting", "interrupted"]},
                           "document": {"type": "string", "description": "What it is bound to (empty until its "
                                        "first run)."},
                           "digest": {"type": "string"},
                           "turns": {"type": "integer", "minimum": 0},
                           "created": {"type": "number"}, "updated": {"type": "number"},
                           "waiting_for": _ref("WaitingFor"),
                           "last": {"type": "object", "required": ["outputs"],
                                    "description": "The last run that finished: its outputs, and `recovered` "
                                                   "when a replica finished it for one that died.",
                                    "properties": {"outputs": {"type": "object"},
                                                   "recovered": {"type": "boolean"}}}}},
        "ValidateRequest": {
            "type": "object",
            "additionalProperties": False,
            "description": "With a bundle, an empty object: the bundle's flow is validated.",
            "properties": {**flow_fields, "inputs": {"type": "object"}},
        },
        "RunResult": {"type": "object", "required": ["flow", "state", "outputs"],
                      "properties": {"flow": {"type": "string"}, "state": {"type": "object"},
                                     "session": {"type": "string", "description": "The session, for a run in "
                                                 "one."},
                                     "outputs": {"type": "object", "description": "The document's outputs alone: "
                                                 "a flow's declared outputs; for an agent document, result (its "
                                                 "answer) and its declared outputs."},
                                     "messages": {"type": "array", "items": {"type": "string"},
                                                  "description": "The messages the run showed (OutputMessageNode), "
                                                  "in order; present when it showed any."}}},
        "ValidationReport": {
            "type": "object",
            "required": ["flow", "valid", "problems", "tools"],
            "properties": {
                "source": {"type": "string"},
                "flow": {"type": "string"},
                "top_level": {"type": "string", "description": "The document's top-level component type (a "
                              "Flow, or an Agent or node heddle runs as a flow)."},
                "agentspec_version": {"type": "string", "nullable": True},
                "nodes": {"type": "object", "additionalProperties": {"type": "integer"}},
                "edges": {"type": "object"},
                "tools": {"type": "array", "items": {
                    "type": "object", "required": ["name", "fingerprint"],
                    "properties": {"name": {"type": "string"}, "fingerprint": {"type": "string"},
                                   "executable": {"type": "string", "nullable": True}}}},
                "tools_checked": {"type": "boolean"},
                "valid": {"type": "boolean"},
                "problems": {"type": "array", "items": {"type": "string"}},
                "waits": {"type": "array", "items": {"type": "string"}, "description": "Where a run may stop "
                          "to wait for a person or a client: such a document runs only in a session."},
                "bundle": {"type": "object"},
            },
        },
        "ListedTool": {
            "type": "object",
            "required": ["name", "source", "description", "input_schema", "input_schema_fingerprint"],
            "additionalProperties": False,
            "description": "One tool the server's runs have, as a flow names it; never where its program is.",
            "properties": {
                "name": {"type": "string"},
                "source": {"type": "string", "enum": ["tools-dir", "plugin", "command", "remote", "client", "mcp"]},
                "description": {"type": "string"},
                "input_schema": {"type": "object", "nullable": True,
                                 "description": "The JSON Schema of its arguments; null where the tool has none "
                                                "of its own (a tools folder's program no ServerTool of the bundle's "
                                                "flow describes, an MCP tool its server describes)."},
                "input_schema_fingerprint": {"type": "string", "nullable": True, "pattern": "^sha256:[0-9a-f]{64}$",
                                             "description": "sha256 of the compact, key-sorted UTF-8 JSON of "
                                                            "input_schema; null with it."},
                "plugin": {"type": "string", "description": "The plugin that provides it."},
                "discovered": {"type": "boolean", "description": "Listed by its plugin's process "
                                                                 "(--discover-tools), not its manifest."},
            },
        },
        "ToolList": {
            "type": "object", "required": ["tools", "toolboxes"], "additionalProperties": False,
            "properties": {
                "tools": {"type": "array", "items": _ref("ListedTool")},
                "toolboxes": {"type": "array", "description": "MCP toolboxes whose tools their server lists once "
                                                             "a run starts it.",
                              "items": {"type": "object", "required": ["name", "source"],
                                        "properties": {"name": {"type": "string"},
                                                       "source": {"type": "string", "enum": ["mcp"]}}}},
            },
        },
        "FollowEvent": {
            "type": "object", "required": ["time", "reason", "kind"],
            "properties": {"time": {"type": "string", "format": "date-time"},
                           "ociDigest": {"type": "string"},
                           "reason": {"type": "string", "description": "The error, in one line."},
                           "kind": {"type": "string", "description": "The error's type, as error bodies name it."}},
        },
        "Capabilities": {
            "type": "object",
            "required": ["version", "allowRequestCode", "acceptsFlowPath", "sandbox", "tools", "protocols",
                         "limits", "runsInFlight", "runSaturation"],
            "properties": {
                "version": {"type": "string"},
                "allowRequestCode": {"type": "boolean"},
                "acceptsFlowPath": {"type": "boolean"},
                "acceptsFlow": {"type": "boolean"},
                "sessions": {"type": "boolean", "description": "Whether it keeps sessions (--session-store)."},
                "sandbox": {"type": "object"},
                "tools": {"type": "array", "items": {"type": "string"}},
                "protocols": {"type": "array", "items": {"type": "string"}},
                "serve": {"type": "array", "items": {"enum": ["runs", "mcp", "a2a", "responses", "ag-ui"]},
                          "description": "The surfaces it answers on (--serve; docs/serving.md)."},
                "events": {"type": "array", "items": {"type": "string"}},
                "limits": {"type": "object"},
                "runsInFlight": {"type": "integer", "minimum": 0},
                "runSaturation": {"type": "number", "minimum": 0},
                "draining": {"type": "boolean"},
                "bundle": {"type": "object", "required": ["name", "digest", "signers", "tools"],
                           "properties": {"name": {"type": "string"}, "digest": {"type": "string"},
                                          "ociDigest": {"type": "string",
                                                        "description": "The registry's digest of the artifact "
                                                                       "it was pulled as."},
                                          "signers": {"type": "array", "items": {"type": "string"}},
                                          "signedAt": {"oneOf": [{"type": "null"},
                                                                 {"type": "string", "format": "date-time"}],
                                                       "description": "When its latest trusted signature was made; "
                                                                      "null when no signature says."},
                                          "release": {"type": "integer", "minimum": 0,
                                                      "description": "The release number it was sealed with."},
                                          "tools": {"type": "object",
                                                    "additionalProperties": {"type": "string"}}}},
                "follow": {"type": "object", "required": ["reference", "pullIntervalMs", "ociDigest", "lastRefusal",
                                                          "lastError"],
                           "description": "With --pull-interval: the tag followed, the digest served, and the last "
                                          "new digest refused (it did not verify, could not be served, or was "
                                          "older than or another agent than the one served) and the last registry "
                                          "or download error, or null.",
                           "properties": {"reference": {"type": "string"},
                                          "pullIntervalMs": {"type": "integer", "minimum": 0},
                                          "ociDigest": {"type": "string"},
                                          "lastCheck": {"type": "string", "format": "date-time"},
                                          "lastRefusal": {"oneOf": [{"type": "null"}, _ref("FollowEvent")]},
                                          "lastError": {"oneOf": [{"type": "null"}, _ref("FollowEvent")]}}},
            },
        },
    }


def openapi_document(version: str, *, auth: bool = False) -> dict[str, Any]:
    # Every route, the probes too: a request must name this server and come from no web page
    # but the --cors-origin ones.
    guarded = {
        "403": _error("The Origin header names a page that --cors-origin does not allow."),
        "421": _error("The Host header does not name this server (see --allowed-host)."),
    }
    denied = {"401": _error("Missing or wrong bearer token.")} if auth else {}
    denied = {**denied, **guarded}
    body_errors = {
        "400": _error("Malformed request or flow, a forbidden field, or a tool with no executable."),
        "404": _error("flowPath names no flow under the flows root."),
        "408": _error("The body did not arrive within --body-timeout."),
        "413": _error("The body is over 1 MiB."),
        "415": _error("The body is not Content-Type: application/json."),
    }
    store_down = {"503": _error("The session store cannot be reached (and, for runs and new sessions, the server is "
                                "draining).")}
    sessions_off = "sessions are off (no --session-store)"
    run_responses = {
        "200": {"description": "The run's final state, or in a session what its run waits for; with ?stream=true, "
                               "its events as Server-Sent Events (event: <type>, data: <json>), ending with an "
                               "'error' frame if it failed after it started, and in a session with 'flow_complete' "
                               "or a 'waiting' frame that carries the Waiting answer. What is refused before the "
                               "run starts is answered with its status, streamed or not.",
                "content": {JSON: {"schema": {"oneOf": [_ref("RunResult"), _ref("Waiting")]}},
                            # Before OpenAPI 3.2 (and its itemSchema) this schema describes each event.
                            "text/event-stream": {"schema": {
                                "type": "object", "required": ["event", "data"],
                                "properties": {"event": {"type": "string", "description": "The event's type "
                                                         "(GET /v1/capabilities lists them), or 'error'."},
                                               "data": {"type": "string", "description": "The event as one line "
                                                        "of JSON."}}}},
                            "*/*": {"schema": {"type": "string"},
                                    "description": "With ?protocol=NAME: the run as an encoder plugin renders it."}}},
        **body_errors,
        "400": _error("Malformed request or flow, a forbidden field, a tool with no executable; a document that "
                      f"may wait for a person without a session; {sessions_off}; an answer the session's run does "
                      "not wait for, or a session bound to another document."),
        "404": _error("flowPath names no flow under the flows root, or there is no such session."),
        "409": _error("Another run changed the session first: this turn was not recorded; run it again. Or "
                      "(already_answered) another answer to the same wait was taken first, and this one ran nothing; "
                      "or the answer carries the fingerprint of another call than the one the session waits on; "
                      "or (release_retired) this server does not hold the release the session began on, and "
                      "nothing ran: start a new session."),
        "413": _error("The body is over 1 MiB, or the session would be over its cap (16 MiB); nothing was "
                      "written."),
        **denied,
        "422": _error("A ToolNode's tool refused the values the run was given (its input schema); "
                      "the tool did not start. Or (call_denied) the answer denied a ToolNode's call, which failed."),
        "429": _error("Every run slot is in use (--max-concurrent); retry later. Runs are never queued."),
        "500": _error("The run failed; or (session_unreadable) the session's stored record is damaged or fails "
                      "its authentication, and nothing ran."),
        "502": _error("The run failed because what it read from outside went past a cap or a deadline: a model's "
                      "answer or a RemoteTool's response over --max-response-bytes once decoded, a tool's stdout "
                      "over --max-tool-stdout-bytes, an answer that did not finish in time."),
        "503": _error("The server is draining and takes no new runs, or the session store cannot be reached."),
    }
    session_param = [{"name": "session_id", "in": "path", "required": True,
                      "schema": {"type": "string", "pattern": SESSION_ID_PATTERN}}]
    session_errors = {
        "400": _error(f"The id is not a valid session id, or {sessions_off}."),
        "404": _error("There is no such session."),
        **store_down,
        **denied,
    }
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "heddle-server", "version": version,
                 "description": "Runs Agent Spec flows, or one sealed heddle bundle, over HTTP. Errors are "
                                "{\"error\": {\"type\", \"message\"}}."},
        "paths": {
            "/healthz": {"get": {"operationId": "healthz", "summary": "Liveness (200 while draining too).",
                                 "security": [],
                                 "responses": {"200": _json(_ref("Health"), "The server is up."), **guarded}}},
            "/readyz": {"get": {"operationId": "readyz", "summary": "Readiness: 503 once draining.",
                                "security": [],
                                "responses": {"200": _json(_ref("Ready"), "Taking runs."),
                                              "503": _json(_ref("Ready"), "Draining."), **guarded}}},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics.",
                                 "responses": {"200": {"description": "Prometheus text format.",
                                                       "content": {"text/plain": {"schema": {"type": "string"}}}},
                                               **denied}}},
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document.",
                                      "responses": {"200": _json({"type": "object"}, "The OpenAPI document."),
                                                    **denied}}},
            "/v1/capabilities": {"get": {"operationId": "capabilities",
                                         "summary": "What this server runs and allows.",
                                         "responses": {"200": _json(_ref("Capabilities"), "Capabilities."),
                                                       **denied}}},
            "/v1/tools": {"get": {"operationId": "tools",
                                  "summary": "Every tool this server's runs have: name, source, description, input "
                                             "schema and its fingerprint (a request's own tools are its own).",
                                  "responses": {"200": _json(_ref("ToolList"), "The tools, by name."), **denied}}},
            "/v1/validate": {"post": {
                "operationId": "validate",
                "summary": "Parse, compile and check a flow (or the bundle's) without running anything.",
                "requestBody": {"required": False, "content": {JSON: {"schema": _ref("ValidateRequest")}}},
                "responses": {"200": _json(_ref("ValidationReport"), "The report; 'valid' says whether it runs."),
                              **body_errors, **denied},
            }},
            "/v1/runs": {"post": {
                "operationId": "run",
                "summary": "Run a flow (or the bundle's) with the given inputs.",
                "parameters": [{"name": "stream", "in": "query", "required": False,
                                "schema": {"type": "boolean"},
                                "description": "Stream the run's events as Server-Sent Events."},
                               {"name": "protocol", "in": "query", "required": False, "schema": {"type": "string"},
                                "description": "Render the run in this protocol (GET /v1/capabilities lists them): "
                                               "'heddle' is the event stream, 'ag-ui' AG-UI's events (the body "
                                               "may then be AG-UI's RunAgentInput), others are encoder plugins."}],
                "requestBody": {"required": False, "content": {JSON: {"schema": _ref("RunRequest")}}},
                "responses": run_responses,
            }},
            "/v1/sessions": {"post": {
                "operationId": "createSession",
                "summary": "Start a session (needs --session-store); its first run binds it to its document.",
                "requestBody": {"required": False, "content": {JSON: {"schema": {
                    "type": "object", "additionalProperties": False, "maxProperties": 0}}}},
                "responses": {"201": {**_json(_ref("SessionCreated"), "The new session's id."), "links": {
                                  name: {"operationId": op, "parameters": {"session_id": "$response.body#/session"}}
                                  for name, op in (("GetSession", "getSession"), ("DeleteSession", "deleteSession"))}},
                              **{code: body_errors[code] for code in ("408", "413", "415")},
                              "400": _error(f"The body is not an empty JSON object (the server chooses ids), or "
                                            f"{sessions_off}."),
                              "507": _error("The store holds --max-sessions sessions (too_many_sessions); one can "
                                            "be started once sessions expire or are removed."),
                              **store_down, **denied},
            }},
            "/v1/sessions/{session_id}": {
                "parameters": session_param,
                "get": {"operationId": "getSession", "summary": "A session's summary: its status, what it is "
                                                                "bound to, its turns and what it waits for.",
                        "responses": {"200": _json(_ref("SessionSummary"), "The session."), **session_errors}},
                "delete": {"operationId": "deleteSession", "summary": "Remove a session.",
                           "responses": {"204": {"description": "Removed."}, **session_errors}},
            },
            "/v1/sessions/{session_id}/events": {
                "parameters": session_param,
                "get": {"operationId": "followSession",
                        "summary": "Reconnect to a session's run: the outcome of its run once it has one, as the "
                                   "last frame of the run's own stream would carry it.",
                        "responses": {
                            "200": {"description": "Server-Sent Events: keep-alive comments while the run goes on "
                                                   "(on this replica, on another, or taken over from a replica that "
                                                   "died), then one last frame: 'flow_complete' {type, session, "
                                                   "outputs, recovered} (recovered: true when a replica finished "
                                                   "the run for one that died), 'waiting' {type, status, session, "
                                                   "waiting_for}, or 'error' {error: {type, message}} (the run "
                                                   "failed and waits for a resume, the session was removed, or the "
                                                   "server began to drain).",
                                    "content": {"text/event-stream": {"schema": {
                                        "type": "object", "required": ["event", "data"],
                                        "properties": {"event": {"type": "string",
                                                                 "enum": ["flow_complete", "waiting", "error"]},
                                                       "data": {"type": "string",
                                                                "description": "The frame as one line of JSON."}}}}}},
                            **session_errors,
                            "409": _error("The session has no run to follow: it has not run yet, or its last run "
                                          "stopped without finishing (continue it with \"resume\": true)."),
                        }},
            },
        },
        "components": {"schemas": _schemas()},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
