"""Where requests go, and which key they carry."""

from __future__ import annotations

import pytest

from heddle.errors import UsageError
from heddle.model.client import endpoint_url, resolve_api_key


@pytest.mark.parametrize(("url", "expected"), [
    ("http://localhost:11434", "http://localhost:11434/v1"),
    ("http://localhost:11434/", "http://localhost:11434/v1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1"),
    ("https://api.example.com/openai/v1//", "https://api.example.com/openai/v1"),
    ("https://api.example.com/api", "https://api.example.com/api"),
    ("  https://api.example.com  ", "https://api.example.com/v1"),
])
def test_endpoint_url_appends_v1_only_without_a_path(url: str, expected: str) -> None:
    assert endpoint_url(url) == expected


@pytest.mark.parametrize("url", ["localhost:11434", "ftp://host/v1", "", "http://"])
def test_endpoint_url_refuses_what_is_not_http(url: str) -> None:
    with pytest.raises(UsageError, match="llm_config 'm'.*not an http\\(s\\) URL") as info:
        endpoint_url(url, where="llm_config 'm'")
    assert info.value.exit_code == 2


def test_dollar_name_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDDLE_TEST_KEY", "sekret")
    assert resolve_api_key("$HEDDLE_TEST_KEY", config_type="OpenAiCompatibleConfig", where="m") == "sekret"
    assert resolve_api_key("${HEDDLE_TEST_KEY}", config_type="OpenAiCompatibleConfig", where="m") == "sekret"


def test_unset_variable_is_an_error_naming_it_and_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEDDLE_TEST_KEY", raising=False)
    with pytest.raises(UsageError) as info:
        resolve_api_key("$HEDDLE_TEST_KEY", config_type="OpenAiCompatibleConfig", where="llm_config 'scripted'")
    message = str(info.value)
    assert "HEDDLE_TEST_KEY" in message and "llm_config 'scripted'" in message and "\n" not in message


def test_empty_variable_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDDLE_TEST_KEY", "")
    with pytest.raises(UsageError, match="HEDDLE_TEST_KEY.*empty"):
        resolve_api_key("$HEDDLE_TEST_KEY", config_type="OpenAiCompatibleConfig", where="m")


def test_malformed_reference_is_an_error() -> None:
    with pytest.raises(UsageError, match="not a valid environment variable reference"):
        resolve_api_key("$NOT-A-NAME", config_type="OpenAiCompatibleConfig", where="m")


def test_literal_keys_pass_through() -> None:
    assert resolve_api_key("sk-literal", config_type="OpenAiCompatibleConfig", where="m") == "sk-literal"


def test_openai_config_without_key_uses_openai_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert resolve_api_key(None, config_type="OpenAiConfig", where="m") == "from-env"
    # Only the vendor's own config type falls back to its conventional variable.
    assert resolve_api_key(None, config_type="OpenAiCompatibleConfig", where="m") is None
    monkeypatch.delenv("OPENAI_API_KEY")
    assert resolve_api_key(None, config_type="OpenAiConfig", where="m") is None
