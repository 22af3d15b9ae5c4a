"""The one socket option heddle's HTTP servers set on every connection they accept.

asyncio turns Nagle's algorithm off only on sockets whose protocol number says TCP, and a
listening socket from `socket.create_server()` says 0, so neither do the connections it
accepts. An answer is written as its head and then its body: with Nagle on, the body waits
for the client to acknowledge the head, which a client delays by up to 40 ms. So each
server says it itself, per connection, whatever made the listening socket.
"""

from __future__ import annotations

import asyncio
import socket


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Send every write of this connection at once (TCP_NODELAY); a no-op off TCP."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
