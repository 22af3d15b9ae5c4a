"""A real A2A 1.0 server (the `a2a-sdk` package's own request handler and JSON-RPC routes) served by
uvicorn on 127.0.0.1 (a port the system picks) from a thread, with agents written for the tests:

- `/echo`: completes each task with "echo: TEXT";
- `/ask`: asks "Which city?" (input-required) on a new task, and completes that same task with
  "weather in CITY (context CONTEXT)" when the answer comes; an answer on another task is a failure;
- `/fail`: fails each task with "the remote agent broke";
- `/slow`: works on each task for longer than any test waits;
- `/garbage`: answers every call with a JSON-RPC result that is neither a task nor a message.

`served()` yields the base URL and the list of requests received (method, params, headers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any


def _executors() -> dict[str, Any]:
    from a2a.helpers.proto_helpers import get_message_text, new_text_message
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.tasks import TaskUpdater
    from a2a.types.a2a_pb2 import Role, Task, TaskState, TaskStatus

    def reply(text: str, context: RequestContext) -> Any:
        return new_text_message(text, context_id=context.context_id, task_id=context.task_id, role=Role.ROLE_AGENT)

    class _Base(AgentExecutor):
        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

        async def begin(self, context: RequestContext, event_queue: EventQueue) -> tuple[TaskUpdater, bool]:
            """The task's updater, and whether the task is new (then enqueued here first)."""
            assert context.task_id is not None and context.context_id is not None
            new = context.current_task is None
            if new:
                await event_queue.enqueue_event(Task(id=context.task_id, context_id=context.context_id,
                                                     status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                                                     history=[context.message]))
            return TaskUpdater(event_queue, context.task_id, context.context_id), new

    class Echo(_Base):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            updater, _ = await self.begin(context, event_queue)
            await updater.complete(reply(f"echo: {get_message_text(context.message)}", context))

    class Ask(_Base):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            updater, new = await self.begin(context, event_queue)
            if new:
                await updater.requires_input(reply("Which city?", context))
                return
            city = get_message_text(context.message)
            await updater.complete(reply(f"weather in {city} (context {context.context_id})", context))

    class Fail(_Base):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            updater, _ = await self.begin(context, event_queue)
            await updater.failed(reply("the remote agent broke", context))

    class Slow(_Base):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            updater, _ = await self.begin(context, event_queue)
            await updater.start_work()
            await asyncio.sleep(5)  # working, past any deadline a test gives it

    return {"echo": Echo(), "ask": Ask(), "fail": Fail(), "slow": Slow()}


def _app(received: list[dict[str, Any]]) -> Any:
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
    from starlette.applications import Starlette
    from starlette.routing import Mount

    mounts = []
    for name, executor in _executors().items():
        card = AgentCard(name=name, description=name, version="1", default_input_modes=["text"],
                         default_output_modes=["text"], capabilities=AgentCapabilities(streaming=False),
                         skills=[AgentSkill(id=name, name=name, description=name, tags=[name])],
                         supported_interfaces=[AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0",
                                                              url=f"/{name}/")])
        handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
        mounts.append(Mount(f"/{name}", routes=create_jsonrpc_routes(handler, "/")))
    inner = Starlette(routes=mounts)

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        try:
            call = json.loads(body or b"{}")
        except ValueError:
            call = {}
        received.append({"path": scope["path"], "method": call.get("method"), "params": call.get("params"),
                         "headers": {k.decode(): v.decode() for k, v in scope["headers"]}})
        if scope["path"].startswith("/garbage"):
            # A 200 whose JSON-RPC result is no task and no message.
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"jsonrpc": "2.0", "id": "1", "result": 42}'})
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await inner(scope, replay, send)

    return recording


@contextlib.contextmanager
def served(**tls: Any) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The server; with `tls` (uvicorn's ssl_* settings) over https."""
    import uvicorn

    received: list[dict[str, Any]] = []
    runner = uvicorn.Server(uvicorn.Config(_app(received), host="127.0.0.1", port=0, log_level="error", **tls))
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    started = threading.Event()
    for _ in range(600):
        if runner.started:
            started.set()
            break
        threading.Event().wait(0.05)
    assert started.is_set(), "the A2A test server did not start"
    port = runner.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", received
    finally:
        runner.should_exit = True
        thread.join(timeout=10)


def certificates(folder: Any) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, as PEM files in
    `folder`: their paths by name (ca, server_cert, server_key, client_cert, client_key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def named(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def made(subject: str, key: Any, issuer: x509.Name, signer: Any, *, ca: bool = False,
             server: bool = False) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(named(subject)).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if ca:
            builder = builder.add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                            critical=True)
            builder = builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                                            critical=False)
        else:
            builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
                                            critical=False)
            usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
            builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(
                ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = made("heddle test CA", ca_key, named("heddle test CA"), ca_key, ca=True)
    paths: dict[str, str] = {}

    def write(name: str, cert: x509.Certificate, key: Any | None = None) -> None:
        paths[name if key is None else f"{name}_cert"] = str(folder / f"{name}.pem")
        (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        if key is not None:
            paths[f"{name}_key"] = str(folder / f"{name}.key")
            (folder / f"{name}.key").write_bytes(key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    write("ca", ca)
    for name in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        write(name, made(f"heddle test {name}", key, ca.subject, ca_key, server=name == "server"), key)
    return paths
