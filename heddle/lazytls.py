"""An HTTP transport that sets TLS up at its first https:// request, not before.

`httpx.AsyncClient()` builds its transport with a TLS context at once, and loading the system's
certificate store into it is most of what a client costs to make (some 70 ms), though a model
served at http://127.0.0.1 never uses it. This transport sends http:// requests on a transport
of its own and makes the one `httpx.AsyncClient()` would have made (the same defaults, the
certificates verified as they always are) for the first https:// request. Nothing is weakened:
the http:// transport's TLS context trusts no certificate at all, so it could not carry a TLS
connection even if one reached it.
"""

from __future__ import annotations

import ssl

import httpx


class LazyTLSTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self._plain: httpx.AsyncHTTPTransport | None = None
        self._tls: httpx.AsyncHTTPTransport | None = None

    def _transport(self, scheme: str) -> httpx.AsyncHTTPTransport:
        if scheme == "https":
            if self._tls is None:
                self._tls = httpx.AsyncHTTPTransport()
            return self._tls
        if self._plain is None:
            self._plain = httpx.AsyncHTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        return self._plain

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._transport(request.url.scheme).handle_async_request(request)

    async def aclose(self) -> None:
        for transport in (self._plain, self._tls):
            if transport is not None:
                await transport.aclose()
