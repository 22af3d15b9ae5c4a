"""The OpenAPI description of every route and body, served at `/openapi.json`.

Written out rather than generated: it is the contract clients and the fuzzing tests hold the
server to, so it changes only on purpose.
"""

from __future__ import annotations

from typing import Any

JSON = "application/json"


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
                                       "document whose top level is an agent (required there, refused for a flow)."}},
        },
        "ValidateRequest": {
            "type": "object",
            "additionalProperties": False,
            "description": "With a bundle, an empty object: the bundle's flow is validated.",
            "properties": {**flow_fields, "inputs": {"type": "object"}},
        },
        "RunResult": {"type": "object", "required": ["flow", "state", "outputs"],
                      "properties": {"flow": {"type": "string"}, "state": {"type": "object"},
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
                "bundle": {"type": "object"},
            },
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
                "sandbox": {"type": "object"},
                "tools": {"type": "array", "items": {"type": "string"}},
                "protocols": {"type": "array", "items": {"type": "string"}},
                "events": {"type": "array", "items": {"type": "string"}},
                "limits": {"type": "object"},
                "runsInFlight": {"type": "integer", "minimum": 0},
                "runSaturation": {"type": "number", "minimum": 0},
                "draining": {"type": "boolean"},
                "bundle": {"type": "object", "required": ["name", "digest", "signers", "tools"],
                           "properties": {"name": {"type": "string"}, "digest": {"type": "string"},
                                          "signers": {"type": "array", "items": {"type": "string"}},
                                          "tools": {"type": "object",
                                                    "additionalProperties": {"type": "string"}}}},
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
    run_responses = {
        "200": {"description": "The run's final state; with ?stream=true, its events as Server-Sent Events "
                               "(event: <type>, data: <json>), ending with an 'error' frame if it failed.",
                "content": {JSON: {"schema": _ref("RunResult")},
                            "text/event-stream": {"schema": {"type": "string"}},
                            "*/*": {"schema": {"type": "string"},
                                    "description": "With ?protocol=NAME: the run as an encoder plugin renders it."}}},
        **body_errors,
        **denied,
        "422": _error("A ToolNode's tool refused the values the run was given (its input schema); "
                      "the tool did not start."),
        "429": _error("Every run slot is in use (--max-concurrent); retry later. Runs are never queued."),
        "500": _error("The run failed."),
        "503": _error("The server is draining and takes no new runs."),
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
                                               "'heddle' is the event stream, others are encoder plugins."}],
                "requestBody": {"required": False, "content": {JSON: {"schema": _ref("RunRequest")}}},
                "responses": run_responses,
            }},
        },
        "components": {"schemas": _schemas()},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
