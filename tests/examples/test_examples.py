"""Every example seals with its one command and runs end to end from the signed bundle."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import heddle as library
from heddle.format.keys import generate
from tests.support.cli import heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.threaded_model import threaded_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTED_URL = "http://127.0.0.1:4320/v1"

CASES = {
    "skills-agent": (["--mount", "./skills"], {"request": "a haiku about weaving"}),
    "notes-rw": (["--mount", "./notes:notes:rw"], {"note": "buy more warp thread"}),
    "triage": ([], {"message": "How do I trust a key?"}),
}


@pytest.fixture
def env(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEDDLE_TRUST_DIR", str(tmp_path / "trust"))
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    generate(tmp_path / "me", None)  # `heddle keygen` itself is tests/bundle/test_cli.py's
    return Env(tmp_path, monkeypatch, capsys)


class Env:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
        self.root, self.monkeypatch, self.capsys = root, monkeypatch, capsys

    def __truediv__(self, name: str) -> Path:
        return self.root / name


def sealed(name: str, env: Env, model_url: str) -> Path:
    work = env / name
    shutil.copytree(EXAMPLES / name, work)
    flow = work / "flow.yaml"
    flow.write_text(flow.read_text().replace(SCRIPTED_URL, model_url))
    extra, _ = CASES[name]
    out = env / f"{name}.heddle"
    # The example's own command line, run by the CLI's entry function in this process: the
    # `heddle run` of the sealed file below is the real process.
    with env.monkeypatch.context() as m:
        m.chdir(work)
        rc, _, err = heddle_inproc(env.capsys, "bundle", "flow.yaml", "--tools-dir", "tools", *extra,
                                   "--sign-key", env / "me.key", "-o", out)
    assert rc == 0, err
    return out


def run(bundle: Path, env: Env, inputs: dict, *extra) -> dict:
    return state_of(heddle("run", bundle, "--trust", env / "me.pub", "--input", json.dumps(inputs), *extra))


def test_skills_agent_reads_its_mounted_skills(env):
    script = EXAMPLES / "skills-agent" / "model.yaml"
    with threaded_model(script) as model:
        # Run through the library from the verified bundle; notes-rw runs the real `heddle run`.
        opened = library.open_bundle(sealed("skills-agent", env, model.url),
                                     trust=library.TrustPolicy.keys(env / "me.pub"))
        state = library.run(opened, inputs=CASES["skills-agent"][1]).state
        requests = model.requests()
    assert "a heddle lifts every thread" in state["result"]
    tool_results = [m["content"] for m in requests[2]["body"]["messages"] if m["role"] == "tool"]
    assert json.loads(tool_results[0]) == {"skills": ["haiku", "limerick"]}
    assert "five, seven and five syllables" in json.loads(tool_results[1])["text"]


def test_notes_rw_hands_the_agents_write_to_the_next_node(env):
    with threaded_model(EXAMPLES / "notes-rw" / "model.yaml") as model:
        bundle = sealed("notes-rw", env, model.url)
        state = run(bundle, env, CASES["notes-rw"][1], "--data-dir", env / "data")
    assert state["count"] == 2 and state["result"] == "Saved your note."
    journal = (env / "data" / "notes" / "journal.md").read_text()
    assert "buy more warp thread" in journal and "oiled on Monday" in journal


def test_triage_routes_each_kind_of_message(env):
    with threaded_model(EXAMPLES / "triage" / "model.yaml") as model:
        bundle = sealed("triage", env, model.url)
        # Each branch through the library, from the same verified bundle (notes-rw runs the real
        # `heddle run` of a sealed example).
        opened = library.open_bundle(bundle, trust=library.TrustPolicy.keys(env / "me.pub"))
        question = library.run(opened, inputs=CASES["triage"][1]).state
        bug = library.run(opened, inputs={"message": "The app crashes on start"}).state
        other = library.run(opened, inputs={"message": "thanks!"}).state
        assert len(model.requests()) == 2
    assert question["category"] == "question" and "heddle trust add" in question["outcome"]
    assert bug["category"] == "bug" and bug["outcome"].startswith("filed BUG-")
    assert other["outcome"] == "archived: thanks!"
