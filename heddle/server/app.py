"""The HTTP routes: a thin layer from requests to the service, and errors to JSON."""

from __future__ import annotations

import logging
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from heddle.errors import HeddleError
from heddle.server.access import RUN_FIELDS, AccessLog, run_fields
from heddle.server.body import Gone, read_json_members, read_json_object
from heddle.server.errors import ApiError, as_api_error, bad_request, error_body, json_answer
from heddle.server.flow_cache import read_known
from heddle.server.guard import guard_middleware
from heddle.server.run_response import RunResponse
from heddle.server.service import Service
from heddle.server.surfaces.agui import PROTOCOL as AGUI

log = logging.getLogger("heddle.server")

_HTTP_TYPES = {404: "not_found", 405: "method_not_allowed"}


class _JSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return json_answer(content)


def _error(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return _JSON(error_body(type_, message), status_code=status, headers=headers)


def _stream_flag(request: Request) -> bool:
    if not request.scope.get("query_string"):
        return False  # nearly every request: no query to parse
    value = request.query_params.get("stream")
    if value is None or value.lower() in ("false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise bad_request(f"query parameter stream={value!r}: use true or false")


def build_app(service: Service) -> Starlette:
    """The ASGI application serving `service`."""
    from heddle import __version__

    config = service.config

    async def healthz(request: Request) -> Response:
        status = "draining" if service.admission.draining else "ok"
        return _JSON({"status": status, "version": __version__})

    async def readyz(request: Request) -> Response:
        if service.admission.draining:
            return _JSON({"status": "draining"}, status_code=503)
        return _JSON({"status": "ready"})

    async def metrics(request: Request) -> Response:
        return Response(service.metrics.render(), media_type=service.metrics.content_type)

    async def capabilities(request: Request) -> Response:
        return _JSON(service.capabilities())

    async def tools(request: Request) -> Response:
        return _JSON(service.edition.tool_listing)

    async def openapi(request: Request) -> Response:
        from heddle.server.openapi import openapi_document

        return _JSON(openapi_document(__version__, auth=config.auth_token is not None))

    async def validate(request: Request) -> Response:
        body = await read_json_object(request, config.max_body_bytes)
        return _JSON(await service.validate(body))

    async def runs(request: Request) -> ASGIApp:  # a Response, or the run's stream
        protocol = request.query_params.get("protocol") if request.scope.get("query_string") else None
        if protocol == AGUI and AGUI in config.surfaces:
            from heddle.server.surfaces.agui import agui_run

            return await agui_run(service, await read_json_object(request, config.max_body_bytes))
        encoder = service.encoder(protocol)
        stream = _stream_flag(request) or protocol == "heddle"
        # A flow sent before is known by its text, which is not read again (heddle.server.flow_cache).
        body, members = await read_json_members(request, config.max_body_bytes, known=service.flows.known)
        read_known(body)
        ticket = service.admission.admit()
        try:
            job = await service.prepare(body, flow_text=members.get("flow"))
        except BaseException:
            ticket.release()
            raise
        request.scope.setdefault("state", {})[RUN_FIELDS] = run_fields(service, job)
        return RunResponse(service, job, ticket, stream=stream, encoder=encoder)

    async def new_session(request: Request) -> Response:
        body = await read_json_object(request, config.max_body_bytes)
        if body:
            raise bad_request(f"request field {min(body)!r} is unknown; POST /v1/sessions takes no fields "
                              "(the server chooses the id, and the session's first run binds it to its document)")
        return _JSON({"session": await service.new_session()}, status_code=201)

    async def session(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        if request.method == "DELETE":
            await service.delete_session(session_id)
            return Response(status_code=204)
        return _JSON(await service.session_summary(session_id))

    async def session_events(request: Request) -> Response:
        from starlette.responses import StreamingResponse

        from heddle.server import sse
        from heddle.server.sessions import followed

        frames = await followed(service, request.path_params["session_id"])
        return StreamingResponse(frames, headers={k.decode(): v.decode() for k, v in sse.HEADERS})

    async def on_api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return _error(exc.status, exc.type, exc.message, exc.headers)

    async def on_heddle_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HeddleError)
        api = as_api_error(exc)
        return _error(api.status, api.type, api.message)

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        type_ = _HTTP_TYPES.get(exc.status_code, "http_error")
        if exc.status_code == 404:
            message = f"no route {request.url.path}; see GET /openapi.json for the routes"
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow")
            message = f"{request.method} is not allowed on {request.url.path}" + (
                f"; allowed: {allowed}" if allowed else "")
        else:
            message = exc.detail
        return _error(exc.status_code, type_, message, dict(exc.headers or {}))

    async def on_gone(request: Request, exc: Exception) -> Response:
        return _error(400, "client_gone", "the client closed the connection while sending its request")

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("request %s %s failed", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal_error", f"the server failed on this request ({type(exc).__name__}); "
                                             "see the server log")

    auth: list[Middleware] = []
    if config.auth_token is not None:
        from heddle.server.auth import BearerAuth

        auth.append(Middleware(BearerAuth, token=config.auth_token))

    # Matched in order: the route of nearly every request first.
    routes = [
        Route("/v1/runs", runs, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/v1/capabilities", capabilities, methods=["GET"]),
        Route("/v1/tools", tools, methods=["GET"]),
        Route("/v1/validate", validate, methods=["POST"]),
        Route("/v1/sessions", new_session, methods=["POST"]),
        Route("/v1/sessions/{session_id}", session, methods=["GET", "DELETE"]),
        Route("/v1/sessions/{session_id}/events", session_events, methods=["GET"]),
    ]
    if "runs" not in config.surfaces:
        # --serve without runs: /v1/runs and its sessions are not served (the other surfaces keep theirs).
        routes = [r for r in routes if not r.path.startswith(("/v1/runs", "/v1/sessions"))]
    from heddle.server.surfaces import surface_routes

    # The other protocols --serve names (MCP, A2A, the Responses API): routes of their own. Each must be a
    # Route: the guard's body check and the access log read a route's own path and methods, so a Mount (or
    # anything else) would serve paths they do not know.
    for route in surface_routes(service):
        if not isinstance(route, Route):
            raise TypeError(f"a surface's route must be a starlette Route, not {type(route).__name__} "
                            f"({getattr(route, 'path', route)!r}): the guard and the access log match Routes only")
        routes.append(route)
    middleware = guard_middleware(host=config.host, allowed_hosts=config.allowed_hosts,
                                  cors_origins=config.cors_origins, auth=auth,
                                  body_paths=[r.path for r in routes if "POST" in (r.methods or ())])
    middleware.insert(0, Middleware(AccessLog, metrics=service.metrics, routes=routes,
                                    capture_content=config.settings.otel_capture_content))
    return Starlette(routes=routes, middleware=middleware, exception_handlers={
        ApiError: on_api_error,
        HeddleError: on_heddle_error,
        HTTPException: on_http_error,
        Gone: on_gone,
        Exception: on_unexpected,
    })
