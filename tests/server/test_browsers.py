"""A web page cannot use the loopback server: foreign Host (DNS rebinding) is 421, a foreign
Origin is 403, a body that is not JSON is 415 — before any request code runs."""

from __future__ import annotations

import pytest

from tests.server.flows import one_tool_flow
from tests.server.support import start_server
from tests.support.server_thread import threaded_server

APP = "https://app.example.com"
EVIL = "https://evil.example"


def error_type(response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    return body["error"]["type"]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    root = tmp_path_factory.mktemp("browsers")
    marker = root / "ran"
    server = start_server(root, "--allow-request-code", "--work-dir", root / "work", "--cors-origin", APP,
                          "--allowed-host", "api.example.com")
    tool = {"name": "mark", "interpreter": "sh", "source": f"cat >/dev/null\ntouch {marker}\necho '{{}}'\n"}
    body = {"flow": one_tool_flow("mark", "mark").document(), "inputs": {"x": 1}, "tools": [tool]}
    with server.client() as client:
        yield server, client, body, marker
    server.stop()


def test_a_page_cannot_run_request_code(guarded):
    import json

    server, client, body, marker = guarded
    raw = json.dumps(body).encode()
    host = f"127.0.0.1:{server.port}"
    refused = [
        # A form a page may post without a preflight, from another origin.
        ({"Content-Type": "text/plain", "Origin": EVIL}, 403, "origin_not_allowed"),
        ({"Content-Type": "application/json", "Origin": "null"}, 403, "origin_not_allowed"),
        # The same with no Origin (a page with a referrer policy cannot drop it; curl can), still not JSON.
        ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
        ({"Content-Type": "application/json; charset=latin-1"}, 415, "unsupported_media_type"),
        ({}, 415, "unsupported_media_type"),
        # DNS rebinding: the page's own name, re-pointed at 127.0.0.1, arrives as the Host.
        ({"Content-Type": "application/json", "Host": f"evil.example:{server.port}"}, 421, "misdirected_request"),
        ({"Content-Type": "application/json", "Host": f"10.1.2.3:{server.port}"}, 421, "misdirected_request"),
    ]
    for headers, status, type_ in refused:
        response = client.post("/v1/runs", content=raw, headers={"Host": host, **headers})
        assert response.status_code == status, (headers, response.text)
        assert error_type(response) == type_, headers
        assert not marker.exists(), headers
    # The very same request, sent as JSON from nowhere or from the allowed page, runs.
    response = client.post("/v1/runs", content=raw, headers={"Content-Type": "application/json; charset=UTF-8"})
    assert response.status_code == 200, response.text
    assert marker.exists()
    response = client.post("/v1/runs", json=body, headers={"Origin": APP})
    assert response.status_code == 200 and response.headers["access-control-allow-origin"] == APP


def test_the_probes_check_the_host_too_and_names_of_this_server_pass(guarded):
    server, client, _, _ = guarded
    for host in ("evil.example", f"evil.example:{server.port}", "localhost.evil.example", "127.0.0.1.nip.io",
                 "bad host:1", "localhost:http"):
        for path in ("/healthz", "/readyz", "/v1/capabilities"):
            response = client.get(path, headers={"Host": host})
            assert response.status_code == 421 and error_type(response) == "misdirected_request", (host, path)
    for host in (f"127.0.0.1:{server.port}", "127.0.0.1", f"localhost:{server.port}", "LocalHost",
                 f"[::1]:{server.port}", "api.example.com", "API.example.com:8443"):
        assert client.get("/healthz", headers={"Host": host}).status_code == 200, host


def test_allowed_pages_get_cors_answers_and_others_nothing(guarded):
    _, client, _, _ = guarded
    preflight = client.options("/v1/runs", headers={"Origin": APP, "Access-Control-Request-Method": "POST",
                                                     "Access-Control-Request-Headers": "content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == APP
    assert "POST" in preflight.headers["access-control-allow-methods"]
    denied = client.options("/v1/runs", headers={"Origin": EVIL, "Access-Control-Request-Method": "POST"})
    assert denied.status_code == 403 and "access-control-allow-origin" not in denied.headers
    # An allowed page can read why its body was refused.
    response = client.post("/v1/validate", content=b"{}", headers={"Origin": APP, "Content-Type": "text/plain"})
    assert response.status_code == 415 and response.headers["access-control-allow-origin"] == APP


def test_a_wildcard_address_accepts_any_ip_and_star_accepts_any_name(tmp_path):
    # Served from a thread by the command's own entry (what is checked is the answers; a real
    # `heddle-server --host 0.0.0.0` process is tests/server/test_startup.py's).
    with threaded_server(tmp_path, "--host", "0.0.0.0") as server:
        port = server.port
        with server.client() as client:
            for host in (f"10.1.2.3:{port}", "192.168.0.7", f"[fe80::1]:{port}", "localhost"):
                assert client.get("/readyz", headers={"Host": host}).status_code == 200, host
            assert client.get("/readyz", headers={"Host": f"evil.example:{port}"}).status_code == 421
    with threaded_server(tmp_path, "--allowed-host", "*") as server, server.client() as client:
        assert client.get("/healthz", headers={"Host": "anything.example"}).status_code == 200
        # Names are not origins: a page still needs --cors-origin.
        assert client.get("/healthz", headers={"Origin": EVIL}).status_code == 403
