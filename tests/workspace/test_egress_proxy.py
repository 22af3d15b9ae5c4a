"""heddle's egress proxy (heddle.workspace.egress_proxy) driven in-process: requests written on its Unix
socket as a tool's relay would pass them on, no sandbox needed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from heddle.egress import EgressError, EgressPolicy, Rule, Secrets, parse_secret
from heddle.workspace import egress_proxy

# A value that must be percent-encoded in a URL: the proxy puts it there as the parameter's value.
SECRET = "s3cr3t+/=&value"


class _Api(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        query = parse_qs(urlsplit(self.path).query)
        data = ("authorized" if query.get("key") == [SECRET] else f"denied {sorted(query)}").encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def api() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_query_placement_is_read_exactly() -> None:
    spec = parse_secret("KEY", {"env": "V", "query": "api_key", "hosts": ["a.example.com"]}, "secrets.KEY")
    assert spec.query == "api_key" and spec.to_json() == {"env": "V", "query": "api_key", "hosts": ["a.example.com"]}
    with pytest.raises(EgressError, match="header or query \\(not both\\)"):
        parse_secret("KEY", {"env": "V", "query": "k", "header": "X-Key: {}", "hosts": ["a.example.com"]}, "s")
    with pytest.raises(EgressError, match="is not a query parameter's name"):
        parse_secret("KEY", {"env": "V", "query": "a&b", "hosts": ["a.example.com"]}, "s")
    # Sealed as declared; a manifest with both placements is refused.
    from heddle.format.errors import MalformedBundleError
    from heddle.format.manifest import Manifest
    from heddle.format.verify import peek
    from tests.bundle.conftest import VECTORS

    base = peek(VECTORS / "valid-signed.heddle").manifest.to_json()
    secrets = {"KEY": spec.to_json()}
    assert Manifest.from_json({**base, "secrets": secrets, "egress": {}}).secrets == secrets
    with pytest.raises(MalformedBundleError, match="header or query"):
        Manifest.from_json({**base, "secrets": {"KEY": {**spec.to_json(), "header": "X-Key: {}"}}, "egress": {}})


def test_a_secret_placed_in_a_query_parameter_goes_to_its_hosts_alone(api: int, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    monkeypatch.setitem(egress_proxy.HOSTS, "api.test", "127.0.0.1")
    monkeypatch.setitem(egress_proxy.HOSTS, "other.test", "127.0.0.1")
    policy = EgressPolicy({"net": (Rule("api.test", api), Rule("other.test", api))})
    secrets = Secrets.read({"KEY": {"env": "HEDDLE_TEST_QUERY_SECRET", "query": "key",
                                    "hosts": [f"api.test:{api}"]}}, {"HEDDLE_TEST_QUERY_SECRET": SECRET})
    refusals: list[egress_proxy.Refusal] = []

    async def main() -> list[str]:
        async with egress_proxy.guarded(policy, "net", refusals.append, secrets) as call:
            placeholder = call.env["KEY"]
            assert SECRET not in placeholder

            async def get(url: str, *headers: str) -> str:
                reader, writer = await asyncio.open_unix_connection(call.socket)
                host = urlsplit(url).netloc
                writer.write("\r\n".join([f"GET {url} HTTP/1.1", f"Host: {host}", *headers, "", ""]).encode())
                answer = await reader.read()
                writer.close()
                return answer.decode()

            at, other = f"http://api.test:{api}", f"http://other.test:{api}"
            return [
                await get(f"{at}/q?a=1&key={placeholder}"),                            # 0 its host
                await get(f"{other}/q?key={placeholder}"),                             # 1 another host
                await get(f"{at}/q?other={placeholder}"),                              # 2 another parameter
                await get(f"{at}/{placeholder}?key={placeholder}"),                    # 3 in the path too
                await get(f"{at}/q", f"Authorization: Bearer {placeholder}"),          # 4 in a header
                await get(f"{at}/q?key=x{placeholder}"),                               # 5 part of a value
            ]

    answers = asyncio.run(main())
    assert answers[0].endswith("authorized"), answers[0]
    for answer in answers[1:]:
        assert answer.startswith("HTTP/1.1 403") and "authorized" not in answer and SECRET not in answer, answer
    reasons = [r.reason for r in refusals]
    assert len(reasons) == 5 and all(r.tool == "net" for r in refusals)
    assert "on its way to other.test" in reasons[0] and "not one of its hosts" in reasons[0]
    assert all("replaced only as the query parameter 'key'" in r for r in reasons[1:]), reasons


def test_a_query_secret_echoed_back_encoded_is_redacted() -> None:
    from urllib.parse import quote

    secrets = Secrets.read({"KEY": {"env": "V", "query": "key", "hosts": ["a.example.com"]}}, {"V": SECRET})
    output, found = egress_proxy.redact({"url": f"/q?key={quote(SECRET, safe='')}", "raw": SECRET}, secrets)
    assert found == ["KEY"] and output == {"url": "/q?key=[secret KEY redacted]", "raw": "[secret KEY redacted]"}
