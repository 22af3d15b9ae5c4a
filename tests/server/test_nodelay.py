"""Every connection heddle-server and the scripted model accept sends its writes at once
(TCP_NODELAY, heddle.tcp): otherwise each answer's body waits for the client's delayed ACK
of its head. heddle-server's answer leaves in one send, head and body together
(heddle.server.connections). In-process: the servers' own listening socket and protocol class,
one connection."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from heddle.model import scripted
from heddle.server import serve
from heddle.server.connections import Limits, protocol_class


async def _nothing(scope: object, receive: object, send: object) -> None:
    return None


async def _accepted_nodelay(bind: Callable[[str, int], socket.socket], protocol: type[H11Protocol]) -> int:
    """TCP_NODELAY of the server's side of one connection made to `bind`'s socket served by `protocol`."""
    config = uvicorn.Config(_nothing, lifespan="off", log_config=None)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    sock = bind("127.0.0.1", 0)
    server = await loop.create_server(lambda: protocol(config, state, {}, loop), sock=sock)
    _reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    try:
        for _ in range(1000):  # accepted within a few turns of the loop
            if state.connections:
                break
            await asyncio.sleep(0)
        (accepted,) = state.connections
        return int(accepted.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("bind, protocol", [
    (serve.bind, protocol_class(Limits(header_timeout=5, body_timeout=5, max_connections=10))),
    (scripted.bind, scripted.Protocol),
], ids=["heddle-server", "scripted-model"])
def test_each_accepted_connection_has_tcp_nodelay(bind: Callable[[str, int], socket.socket],
                                                  protocol: type[H11Protocol]) -> None:
    assert asyncio.run(_accepted_nodelay(bind, protocol)) != 0


async def _answer(scope: object, receive: object, send: Callable[[dict[str, object]], Awaitable[None]]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json"),
                                                                  (b"content-length", b"11")]})
    await send({"type": "http.response.body", "body": b'{"ok":true}'})


async def _sends_of_one_answer() -> tuple[list[bytes], bytes]:
    """What heddle-server's protocol handed its connection's socket transport for one answer, write by
    write, and what the client read."""
    config = uvicorn.Config(_answer, lifespan="off", log_config=None)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    sock = serve.bind("127.0.0.1", 0)
    protocol = protocol_class(Limits(header_timeout=5, body_timeout=5, max_connections=10))
    server = await loop.create_server(lambda: protocol(config, state, {}, loop), sock=sock)
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    try:
        for _ in range(1000):
            if state.connections:
                break
            await asyncio.sleep(0)
        (accepted,) = state.connections
        real = accepted.transport._transport  # type: ignore[attr-defined]
        sent: list[bytes] = []
        write = real.write

        def recorded(data: bytes) -> None:
            sent.append(bytes(data))
            write(data)

        real.write = recorded
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        return sent, answer
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


def test_an_answer_leaves_in_one_send() -> None:
    sent, answer = asyncio.run(_sends_of_one_answer())
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'\r\n\r\n{"ok":true}')
    assert len(sent) == 1 and sent[0] == answer
