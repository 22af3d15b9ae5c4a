"""Secrets are never sealed silently: files that look like secrets are refused unless
`--include-secret` names them, a model key written in the flow is refused, and `heddle doctor`
lists the variables the flow reads instead."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from heddle import seal
from heddle.bundle.collect import SecretScreen
from heddle.bundle.flowenv import env_reads, literal_keys
from heddle.format.errors import PackError
from heddle.format.pack import PlanFile, pack
from tests.support.cli import error_line, heddle
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, llm_config

from .conftest import KeyPair, agent_plan, write_agent

PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.mark.parametrize("path, secret", [
    ("id_rsa", True), ("keys/id_ed25519", True), ("id_ecdsa", True), ("id_dsa", True), ("tls/server.pem", True),
    ("a.key", True), ("cert.P12", True), ("x.pfx", True), (".ssh/known_hosts", True), ("home/.aws/config", True),
    (".gnupg/pubring.kbx", True), (".netrc", True), (".npmrc", True), (".pypirc", True), (".git-credentials", True),
    (".docker/config.json", True), (".kube/config", True), (".env", True), ("app/.env.local", True), (".envrc", True),
    ("id_rsa.pub", False), ("config.json", False), ("env.txt", False), ("notes/.environment", False),
    ("kube/config", False), ("keys.md", False), ("ssh/notes.txt", False),
])
def test_names_that_look_like_secrets(path: str, secret: bool) -> None:
    # Judged by the payload path (the file comes from a folder with an innocent name, under its own name).
    name = PurePosixPath(path).name
    screen = SecretScreen([PlanFile(path, f"/srv/source/{name}")])
    if secret:
        with pytest.raises(PackError, match=f"as {path}: "):
            screen.judge([])
    else:
        screen.judge([])


def _secret_mount(root: Path) -> Path:
    mount = root / "notes"
    mount.mkdir(parents=True)
    (mount / "readme.md").write_text("# notes\n")
    (mount / ".env").write_text("TOKEN=abc\n")
    (mount / "id_ed25519").write_text("not really\n")
    # A key under an innocent name, after a byte-order mark and blank lines.
    (mount / "notes.txt").write_bytes(b"\xef\xbb\xbf\n  \n" + PEM.encode())
    (mount / "pubkey.txt").write_text("-----BEGIN PUBLIC KEY-----\nMCow\n-----END PUBLIC KEY-----\n")
    return mount


def test_secret_files_are_refused_by_name_and_content_and_nothing_is_written(
        sandbox: Path, keypair: KeyPair, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.bundle.test_run_bundle import project

    src = sandbox / "src"
    src.mkdir()
    flow, tools = project(src)
    mount = _secret_mount(src / "secret")
    out = sandbox / "out"
    out.mkdir()
    mounts = [str(src / "notes"), f"{src / 'data'}:data:rw", f"{mount}:more"]
    args = ["bundle", flow, "-t", tools, *(a for m in mounts for a in ("--mount", m)),
            "--sign-key", keypair.key_path, "-o", out / "app.heddle"]
    proc = heddle(*args)
    assert proc.returncode == 2, proc.stderr
    line = error_line(proc)
    for name in (".env", "id_ed25519", "notes.txt"):
        assert f"{mount / name} (as mounts/more/{name}:" in line
    assert "readme.md" not in line and "pubkey.txt" not in line
    assert "--include-secret PATH" in line and "3 files look like secrets" in line
    assert os.listdir(out) == []

    # All of them allowed by their folder (through the command's entry, in-process: the refusal
    # above is the real process), or each one by name (the same rule, by the library): sealed,
    # and in the manifest.
    rc, _, err = heddle_inproc(capsys, *args, "--include-secret", mount)
    assert rc == 0, err
    from heddle.format.verify import peek

    for allow in ([mount], [mount / ".env", mount / "id_ed25519", mount / "notes.txt"]):
        if allow != [mount]:
            seal(flow, tools_dir=tools, mounts=mounts, sign_key=keypair.signing, include_secrets=allow,
                 output=out / "app.heddle")
        listing = {f.path for f in peek(out / "app.heddle").manifest.files}
        assert {f"mounts/more/{name}" for name in (".env", "id_ed25519", "notes.txt")} <= listing

    # Allowing one but not the others still names the others; an allowance that matches no
    # secret is refused rather than ignored. The rule is the packer's: checked in-process, the
    # exit code and message being what the command prints on its error line.
    def refusal(*allow: Path) -> str:
        with pytest.raises(PackError) as caught:
            seal(flow, tools_dir=tools, mounts=mounts, sign_key=keypair.signing, include_secrets=allow,
                 output=out / "other.heddle")
        assert caught.value.exit_code == 2 and not (out / "other.heddle").exists()
        return caught.value.message

    message = refusal(mount / ".env")
    assert "2 files look like secrets" in message and f"{mount / '.env'} (as" not in message
    message = refusal(mount, src / "notes" / "readme.md")
    assert f"--include-secret {src / 'notes' / 'readme.md'}: no file sealed from there looks like a secret" \
        in message


def test_secrets_in_the_tools_folder_and_plugin_folders_are_refused_too(sandbox: Path) -> None:
    paths = write_agent(sandbox / "agent")
    (paths["tools"] / ".aws").mkdir()
    (paths["tools"] / ".aws" / "credentials").write_text("[default]\n")
    plugin = sandbox / "agent" / "plug"
    plugin.mkdir()
    (plugin / "plugin.json").write_text('{"name": "greeter"}')
    (plugin / "deploy").write_text(PEM)
    # Judged as the packer hashes the files (contents from that one read), before anything is written.
    with pytest.raises(PackError) as caught:
        pack(agent_plan(paths, plugins=[plugin / "plugin.json"]), sandbox / "app.heddle")
    assert not (sandbox / "app.heddle").exists()
    message = caught.value.message
    assert f"{paths['tools'] / '.aws' / 'credentials'} (as tools/.aws/credentials: inside .aws/)" in message
    assert f"{plugin / 'deploy'} (as plugins/greeter/deploy: a private key by its content)" in message
    plan = agent_plan(paths, plugins=[plugin / "plugin.json"], include_secrets=[paths["tools"] / ".aws", plugin / "deploy"])
    packed = pack(plan, sandbox / "app.heddle")
    assert {"tools/.aws/credentials", "plugins/greeter/deploy"} <= {f.path for f in packed.manifest.files}


def _llm_flow(path: Path, config: dict, **extra_refs: dict) -> Path:
    f = FlowDoc("asks")
    s = f.start(["question"])
    n = f.llm("answer", config, "{{question}}", inputs=["question"])
    e = f.end(["generated_text"])
    f.control(s, n)
    f.control(n, e)
    f.data(s, "question", n, "question")
    f.data(n, "generated_text", e, "generated_text")
    f.extra_refs.update(extra_refs)
    return f.write(path)


def test_a_literal_api_key_is_refused_at_seal(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow = _llm_flow(sandbox / "flow.yaml", llm_config("http://127.0.0.1:9/v1", name="gpt", api_key="sk-live-123"))
    out = sandbox / "app.heddle"
    # Through the command's entry in-process: a `heddle bundle` process refusing with its one
    # error line is test_secret_files_are_refused_by_name_and_content_and_nothing_is_written.
    rc, stdout, stderr = heddle_inproc(capsys, "bundle", flow, "-o", out)
    assert rc == 2, stderr
    [line] = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert f"flow {flow}: llm_config 'gpt' (id 'llm-" in line
    assert "at $.$referenced_components.answer-" in line and ".llm_config has a literal api_key" in line
    assert 'write api_key: "$VAR"' in line
    assert "sk-live-123" not in stdout + stderr
    assert not out.exists()
    # With the key in the environment instead, it seals.
    _llm_flow(flow, llm_config("http://127.0.0.1:9/v1", name="gpt", api_key="$MODEL_KEY"))
    seal(flow, output=out)
    assert out.exists()


def test_literal_keys_are_found_wherever_the_document_holds_them() -> None:
    unused = {"component_type": "OllamaConfig", "id": "spare", "name": "spare", "model_id": "m",
              "url": "http://x", "api_key": "abc"}
    document = {"component_type": "Flow", "nodes": [{"component_type": "AgentNode", "agent": {
        "llm_config": {"component_type": "OpenAiConfig", "name": "main", "model_id": "m", "api_key": "${KEY}"}}}],
        "$referenced_components": {"spare": unused, "other": {**unused, "name": "b", "id": "b", "api_key": "$not a ref"}}}
    assert literal_keys(document) == [
        "llm_config 'spare' at $.$referenced_components.spare has a literal api_key",
        "llm_config 'b' at $.$referenced_components.other has a literal api_key",
    ]
    # The resolved document: only what is used, each variable once.
    assert [(r.name, r.required) for r in env_reads(document)] == [("KEY", True)]
    # A model with no key of its own sends OPENAI_API_KEY when it is set, and goes on without it.
    del document["nodes"][0]["agent"]["llm_config"]["api_key"]
    [read] = env_reads(document)
    assert (read.name, read.required) == ("OPENAI_API_KEY", False)


def test_doctor_lists_the_variables_the_flow_reads(sandbox: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    flow = _llm_flow(sandbox / "flow.json", llm_config("http://127.0.0.1:9/v1", name="gpt", api_key="$HEDDLE_TEST_MODEL_KEY"))
    bundle = sandbox / "app.heddle"
    seal(flow, output=bundle)

    # Through the command's entry in this process (`doctor`'s exit 9 from a process is
    # tests/bundle/test_cli.py::test_doctor_json_keeps_the_exit_status's).
    monkeypatch.setenv("HEDDLE_TEST_MODEL_KEY", "")
    proc = heddle_here(capsys, "doctor", bundle)
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert "MISSING env  HEDDLE_TEST_MODEL_KEY: not set; the flow reads it (api_key of llm_config 'gpt'" in proc.stdout
    assert "1 of 1 requirements missing: env HEDDLE_TEST_MODEL_KEY" in error_line(proc)

    # Set.
    monkeypatch.setenv("HEDDLE_TEST_MODEL_KEY", "very-secret-value")
    rc, out, err = heddle_inproc(capsys, "doctor", bundle)
    assert rc == 0, err
    assert "ok      env  HEDDLE_TEST_MODEL_KEY: set; the flow reads it" in out
    assert "very-secret-value" not in out + err


def _exported(sandbox: Path, key: str) -> tuple[Path, Path]:
    """An Agent as pyagentspec 26.3.1 exports it with its llm config disaggregated: the config in a
    components file, its api_key a `$component_ref` to `ID.api_key`, whose value is given apart."""
    import json

    flow, shared = sandbox / "agent.json", sandbox / "components.json"
    flow.write_text(json.dumps({
        "component_type": "Agent", "id": "ag", "name": "a", "description": None, "metadata": {}, "inputs": [],
        "outputs": [], "llm_config": {"$component_ref": "cfg"}, "system_prompt": "hi", "tools": [], "toolboxes": [],
        "human_in_the_loop": True, "agentspec_version": "25.4.2"}))
    shared.write_text(json.dumps({"$referenced_components": {
        "cfg": {"component_type": "OpenAiCompatibleConfig", "id": "cfg", "name": "m", "description": None,
                "metadata": {}, "model_id": "x", "api_type": "chat_completions", "url": "http://127.0.0.1:9/v1",
                "api_key": {"$component_ref": "cfg.api_key"}, "default_generation_parameters": None,
                "agentspec_version": "25.4.2"},
        "cfg.api_key": key}}))
    return flow, shared


def test_an_api_key_given_by_component_ref_is_a_reference_not_a_key(sandbox: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    flow, shared = _exported(sandbox, "$HEDDLE_TEST_MODEL_KEY")
    out = sandbox / "app.heddle"
    rc, _, stderr = heddle_inproc(capsys, "bundle", flow, "--components", shared, "-o", out)
    assert rc == 0, stderr
    import json

    assert [r.name for r in env_reads(json.loads(flow.read_text()), json.loads(shared.read_text()))] == [
        "HEDDLE_TEST_MODEL_KEY"]
    # What the reference names is checked where it is written: a key there is refused.
    flow, shared = _exported(sandbox, "sk-live-123")
    out.unlink()
    rc, stdout, stderr = heddle_inproc(capsys, "bundle", flow, "--components", shared, "-o", out)
    assert rc == 2 and "'cfg.api_key'" in stderr and "literal api_key" in stderr, stderr
    assert "sk-live-123" not in stdout + stderr and not out.exists()


def test_a_referenced_key_is_checked_wherever_it_is_written() -> None:
    config = {"component_type": "OpenAiConfig", "id": "c", "name": "main", "model_id": "m",
              "api_key": {"$component_ref": "secret"}}
    document = {"component_type": "Agent", "llm_config": config, "$referenced_components": {"secret": "$KEY"}}
    assert literal_keys(document) == []
    document["$referenced_components"] = {"secret": "abc"}
    assert literal_keys(document) == [("llm_config 'main' (id 'c') at $.llm_config has a literal api_key, given by "
                                       "$component_ref 'secret' at $.$referenced_components.secret")]
    del document["$referenced_components"]
    assert literal_keys(document, {"$referenced_components": {"secret": "abc"}}) == [
        ("llm_config 'main' (id 'c') at $.llm_config has a literal api_key, given by $component_ref 'secret' at "
         "--components $.$referenced_components.secret")]
