"""`--serve` chooses the surfaces a server answers on; what it cannot serve is refused by name at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from heddle.errors import UsageError
from heddle.server.config import SURFACES, ServerConfig, check_config, served_surfaces


def test_every_surface_by_default_with_a_bundle_and_runs_and_ag_ui_without() -> None:
    assert served_surfaces(None, bundle=True) == frozenset(SURFACES)
    assert served_surfaces(None, bundle=False) == {"runs", "ag-ui"}
    assert served_surfaces(" runs , A2A", bundle=True) == {"runs", "a2a"}
    assert ServerConfig(bundle="app.heddle", serve="mcp").surfaces == {"mcp"}


@pytest.mark.parametrize("serve,bundle,said", [
    ("runs,grpc", True, "--serve 'runs,grpc': 'grpc' is not a surface; give some of runs,mcp,a2a,responses,ag-ui"),
    ("runs,", True, "--serve 'runs,': a surface is missing"),
    ("a2a", False, "--serve a2a answers as one agent, and this server serves no bundle; give --bundle X.heddle"),
    ("ag-ui", True, "--serve ag-ui is an encoding of the stream of /v1/runs; add runs to --serve"),
])
def test_a_surface_that_cannot_be_served_is_refused_by_name(serve: str, bundle: bool, said: str) -> None:
    with pytest.raises(UsageError) as refused:
        check_config(ServerConfig(bundle="app.heddle" if bundle else None, serve=serve))
    assert said in refused.value.message


def test_the_card_key_needs_a2a_and_the_address_it_signs(tmp_path: Path) -> None:
    key = tmp_path / "me.key"
    with pytest.raises(UsageError, match="serves no a2a"):
        check_config(ServerConfig(card_key=key))
    with pytest.raises(UsageError, match="give that address with --public-url"):
        check_config(ServerConfig(bundle="app.heddle", card_key=key))
    with pytest.raises(UsageError, match="--public-url 'ftp://x'"):
        check_config(ServerConfig(bundle="app.heddle", card_key=key, public_url="ftp://x"))
    check_config(ServerConfig(bundle="app.heddle", card_key=key, public_url="https://agents.example.com"))


def test_without_a2a_sdk_the_default_leaves_a2a_out_and_naming_it_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("a2a") else real(name, *a))
    assert served_surfaces(None, bundle=True) == frozenset(SURFACES) - {"a2a"}
    with pytest.raises(UsageError, match=r"--serve a2a needs a package .* pip install 'heddle\[a2a\]'"):
        check_config(ServerConfig(bundle="app.heddle", serve="runs,a2a"))
