"""Documents through the real `heddle` command: an agent at the top (`--message`), `--outputs`,
shared components from a second file (`--components`, sealed into a bundle), `--model-url`, and
the warning for a feature newer than the declared agentspec_version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import llm_config, prop, server_tool, write_tool
from tests.support.threaded_model import threaded_model


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def agent(llm: dict[str, Any]) -> dict[str, Any]:
    return {"component_type": "Agent", "id": "helper", "name": "helper", "agentspec_version": "25.4.1",
            "inputs": [prop("user")], "llm_config": llm, "system_prompt": "You help {{user}}."}


def test_an_agent_document_takes_the_users_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with threaded_model([{"content": "Hello Ann!"}, {"content": "again"}]) as model:
        doc = write(tmp_path / "agent.json", agent(llm_config(model.url, name="brain")))
        proc = heddle("run", doc, "--input", '{"user": "Ann"}', "--message", "hi there", "--outputs")
        assert state_of(proc) == {"result": "Hello Ann!"}
        assert model.requests()[0]["body"]["messages"][1] == {"role": "user", "content": "hi there"}
        # Without a terminal there is no one to ask: the message must be given.
        proc = heddle("run", doc, "--input", '{"user": "Ann"}')
        assert proc.returncode == 2
        assert error_line(proc).endswith("answers a user: give the user's message with --message TEXT")
        # --model-url sends the config's requests elsewhere for one run; --verbose says so (the
        # command in-process: the process's own path is the runs above).
        elsewhere = model.url.replace("/v1", "/elsewhere/v1")
        proc = heddle_here(capsys, "run", doc, "--input", '{"user": "Ann"}', "--message", "hi", "--verbose",
                      "--model-url", f"brain={elsewhere}")
        assert proc.returncode == 0, proc.stderr
        assert "model url llm_config 'brain' (id " in proc.stderr
        assert f": {elsewhere} (--model-url brain; the document says {model.url})" in proc.stderr
        assert model.requests()[1]["path"] == "/elsewhere/v1/chat/completions"
        proc = heddle_here(capsys, "run", doc, "--input", '{"user": "Ann"}', "--message", "hi",
                           "--model-url", "nope=http://x")
        assert proc.returncode == 2 and "no llm config of that name or id; its llm configs are: 'brain'" in \
            error_line(proc)
        assert len(model.requests()) == 2


def test_on_a_terminal_the_message_is_asked_for(tmp_path: Path) -> None:
    import os
    import pty
    import subprocess

    from tests.support.cli import BIN, env_with

    with threaded_model([{"content": "Hello Ann!"}]) as model:
        doc = write(tmp_path / "agent.json", agent(llm_config(model.url, name="brain")))
        leader, follower = pty.openpty()
        try:
            proc = subprocess.Popen([str(BIN / "heddle"), "run", doc, "--input", '{"user": "Ann"}', "--outputs"],
                                    stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_with())
            os.write(leader, b"typed words\n")
            out, err = proc.communicate(timeout=60)
        finally:
            os.close(leader)
            os.close(follower)
        assert proc.returncode == 0, err
        assert json.loads(out) == {"result": "Hello Ann!"} and b"Message" in err
        assert model.requests()[0]["body"]["messages"][1] == {"role": "user", "content": "typed words"}


def test_outputs_alone_and_a_message_for_a_flow_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "upper", 'out = {"loud": args["text"].upper()}')
    doc = write(tmp_path / "node.json", {"component_type": "ToolNode", "id": "t", "name": "t",
                                        "agentspec_version": "25.4.1",
                                        "tool": server_tool("upper", [prop("text")], [prop("loud")])})
    # --outputs from a process is test_an_agent_document_takes_the_users_message's; a node document's here.
    assert state_of(heddle_here(capsys, "run", doc, "-t", tools, "--input", '{"text": "hey"}', "--outputs")) == {
        "loud": "HEY"}
    # Without --outputs the final state is printed: the state the engine ends with, in-process.
    from tests.support.inproc import run_doc

    assert run_doc(doc, tools, {"text": "hey"}) == {"text": "hey", "loud": "HEY"}
    proc = heddle_here(capsys, "run", doc, "-t", tools, "--input", '{"text": "hey"}', "--message", "hello")
    assert proc.returncode == 2 and error_line(proc).startswith(f"error: --message: {doc} is not an agent")


def test_a_newer_feature_than_declared_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # pyagentspec 26.3.1 refuses it: "the minimum allowed version is 26.1.2".
    refs = {"ss": {"component_type": "StartNode", "id": "ss", "name": "ss"},
            "se": {"component_type": "EndNode", "id": "se", "name": "se"}}
    sub = {"component_type": "Flow", "id": "sub", "name": "sub", "start_node": {"$component_ref": "ss"},
           "nodes": [{"$component_ref": "ss"}, {"$component_ref": "se"}], "$referenced_components": refs,
           "control_flow_connections": [{"component_type": "ControlFlowEdge", "name": "x",
                                         "from_node": {"$component_ref": "ss"}, "to_node": {"$component_ref": "se"}}]}
    doc = write(tmp_path / "catch.json", {"component_type": "CatchExceptionNode", "id": "c", "name": "guard",
                                          "subflow": sub, "agentspec_version": "25.4.1"})
    proc = heddle_here(capsys, "run", doc, "--outputs")
    assert proc.returncode == 2, proc.stderr
    assert (f"{doc}: $ is a CatchExceptionNode, which Agent Spec 26.1.2 introduced, but the document "
            "declares agentspec_version 25.4.1; declare 26.1.2 or later") in proc.stderr


def test_components_from_a_second_file_are_sealed_into_the_bundle(sandbox: Path, keypair: Any,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with threaded_model([{"content": "one"}, {"content": "two"}]) as model:
        main = write(sandbox / "main.json", {**agent({"$component_ref": "brain"})})
        comps = write(sandbox / "shared.json", {"$referenced_components": {
            "brain": llm_config(model.url, name="brain")}})
        # The run from the two files, the reading of the bundle and the run from it in-process:
        # `heddle bundle --components` is the process this test is about (`heddle run` of a bundle
        # has its own in tests/bundle/test_run_bundle.py).
        proc = heddle_here(capsys, "run", main, "--components", comps, "--input", '{"user": "Ann"}', "--message",
                           "hi", "--outputs")
        assert state_of(proc) == {"result": "one"}
        out = sandbox / "app.heddle"
        proc = heddle("bundle", main, "--components", comps, "--sign-key", keypair.key_path, "-o", out)
        assert proc.returncode == 0, proc.stderr
        assert "components components/shared.json" in heddle_here(capsys, "inspect", out).stdout
        # The sealed copy is what runs (verified first, as every run from a bundle is): editing
        # the source file afterwards changes nothing.
        comps.write_text("{}", encoding="utf-8")
        proc = heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--input", '{"user": "Ann"}',
                           "--message", "hi", "--outputs")
        assert state_of(proc) == {"result": "two"}
        proc = heddle_here(capsys, "run", out, "--trust", keypair.pub_path, "--components", comps, "--message", "hi")
        assert proc.returncode == 2 and "--components cannot be used with the bundle" in error_line(proc)


def test_the_manifest_names_the_components_file_only_when_there_is_one() -> None:
    from heddle.format.errors import MalformedBundleError
    from heddle.format.manifest import FileEntry, Manifest

    files = tuple(FileEntry(path, 2, "0" * 64, 420) for path in ("components/c.json", "flow.json"))
    plain = Manifest(name="n", flow="flow.json", files=files, heddle_version="0")
    assert "components" not in plain.to_json()
    shared = Manifest(name="n", flow="flow.json", files=files, heddle_version="0", components="components/c.json")
    assert Manifest.from_bytes(shared.to_bytes()) == shared
    for value, problem in (("components/other.json", "is not one of the files"), ("flow.json", "is the flow itself")):
        with pytest.raises(MalformedBundleError, match=rf"components: .*{problem}"):
            Manifest.from_json({**shared.to_json(), "components": value})


def test_a_key_written_in_the_components_file_is_never_sealed(sandbox: Path) -> None:
    import heddle
    from heddle.format.errors import PackError

    # api_key is a field of Agent Spec 25.4.2 (pyagentspec refuses it in a 25.4.1 document).
    main = write(sandbox / "main.json", {**agent({"$component_ref": "brain"}), "agentspec_version": "25.4.2"})
    comps = write(sandbox / "shared.json", {"$referenced_components": {
        "brain": llm_config("http://127.0.0.1:9/v1", name="brain", api_key="sk-written-down")}})
    with pytest.raises(PackError, match=rf"^--components {comps}: llm_config 'brain' .* has a literal api_key"):
        heddle.seal(main, output=sandbox / "x.heddle", components=comps)
    assert not (sandbox / "x.heddle").exists()
