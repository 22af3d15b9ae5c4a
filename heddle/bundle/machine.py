"""What a bundle needs of the machine it runs on beyond its `requires`, checked by `heddle doctor`:
each command's program (at its sealed path, with its sealed sha256, answering its version probe
with the expected version), each plugin's runtime (the program its manifest's `command` starts),
and bubblewrap when the bundle proposes `--safe`.

Looking is all that is done for a bundle nobody here trusts: its files are read from the archive
and checked against the manifest's sha256, never unpacked. A version probe runs a program of this
machine with arguments the bundle chose, so it runs only for a bundle whose signers are trusted (or
an unsigned one, with --allow-unsigned); otherwise that check is reported as not made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from heddle.bundle.requires import RequirementCheck
from heddle.engine.tracing import ENDPOINT_VARIABLES, EXTRA, endpoint, installed
from heddle.errors import HeddleError, UsageError
from heddle.format.archive import read_head
from heddle.format.errors import MalformedBundleError
from heddle.format.limits import DEFAULT_LIMITS
from heddle.format.signing import check_signatures
from heddle.format.trust import TrustPolicy
from heddle.format.verify import open_file, sealed_manifest, walk_payload
from heddle.plugin_host.launch import PYTHON_COMMANDS
from heddle.tools.command_run import _difference
from heddle.tools.commands import SYSTEM_PATH, Program, parse_commands, program_digest
from heddle.workspace.sandbox import SandboxPolicy, check_policy

if TYPE_CHECKING:
    from heddle.format.manifest import Manifest
    from heddle.tools.commands import Command

# Most bytes of a plugin program read for its `#!` line.
_SHEBANG_BYTES = 256


class _Kept:
    """A payload sink that keeps the bytes of one file (the walk checks them against the manifest)."""

    def __init__(self, out: bytearray | None) -> None:
        self._out = out

    def write(self, chunk: memoryview) -> None:
        if self._out is not None:
            self._out += chunk

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        if self._out is not None:
            self._out.clear()


def sealed_files(bundle: Path, paths: Iterable[str]) -> dict[str, bytes]:
    """The bytes of the payload files `paths` of `bundle`, each checked against the manifest's
    sha256 by the walk (which reads the whole payload): nothing is trusted or unpacked."""
    what = str(bundle)
    wanted = {path: bytearray() for path in paths}
    if not wanted:
        return {}
    with open_file(bundle) as fh:
        head = read_head(fh, what=what, limits=DEFAULT_LIMITS)
        manifest = sealed_manifest(head, what=what, limits=DEFAULT_LIMITS)
        walk_payload(head.reader, manifest, lambda item: _Kept(wanted.get(item.path)), what=what)
    listed = {f.path for f in manifest.files}
    missing = sorted(set(wanted) - listed)
    if missing:
        raise MalformedBundleError(f"{what}: the file {missing[0]!r} the manifest names is not in the payload")
    return {path: bytes(data) for path, data in wanted.items()}


def check_machine(bundle: Path, manifest: Manifest, *, probe: bool, why_not: str = "") -> list[RequirementCheck]:
    """A check for each command, plugin and sandbox the bundle needs. `probe` says whether the
    commands' version probes may run (the bundle is trusted here); `why_not` says why they may not."""
    plugin_manifests = {p.manifest: p for p in manifest.plugins}
    files = sealed_files(bundle, [*([manifest.commands.file] if manifest.commands else []), *plugin_manifests])
    checks: list[RequirementCheck] = []
    if manifest.commands is not None:
        sealed = manifest.commands
        programs = {name: Program(e.executable_path, e.executable_sha256, sealed=True)
                    for name, e in sealed.entries.items()
                    if e.executable_path is not None and e.executable_sha256 is not None}
        what = f"the sealed commands file {sealed.file}"
        commands = parse_commands(files[sealed.file], path=Path(sealed.file), what=what, programs=programs,
                                  error=MalformedBundleError)
        for command in commands:
            if command.name not in sealed.entries or sealed.entries[command.name].revision != command.revision:
                raise MalformedBundleError(f"{bundle}: command {command.name!r} of {what} is not the one its "
                                           "manifest lists")
            checks += _command_checks(command, SYSTEM_PATH, probe=probe, why_not=why_not)
    programs_wanted: dict[str, tuple[str, str]] = {}
    for path, plugin in plugin_manifests.items():
        check, program = _plugin_check(plugin.name, plugin.dir, files[path])
        if program is None:
            checks.append(check)
        else:
            programs_wanted[program] = (plugin.name, plugin.dir)
    if programs_wanted:
        for path, data in sealed_files(bundle, programs_wanted).items():
            checks.append(_shebang_check(programs_wanted[path][0], path, data[:_SHEBANG_BYTES]))
    if manifest.proposals.safe:
        checks.append(_sandbox_check())
    return checks


def _command_checks(command: Command, system_path: tuple[str, ...], *, probe: bool,
                    why_not: str) -> list[RequirementCheck]:
    pin = command.program
    if pin is None:
        return [RequirementCheck("command", command.name, False,
                                 f"its program {command.executable!r} is in none of {':'.join(system_path)}")]
    try:
        found = program_digest(pin.path)
    except OSError as exc:
        return [RequirementCheck("command", command.name, False, f"its program {pin.path} is not here "
                                 f"({exc.strerror}); the bundle was sealed with sha256 {pin.sha256}")]
    if found != pin.sha256:
        return [RequirementCheck("command", command.name, False, f"{pin.path} is not the program sealed: sha256 "
                                 f"{pin.sha256} sealed, {found} here")]
    checks = [RequirementCheck("command", command.name, True, f"{pin.path}, sha256 {pin.sha256} as sealed")]
    if not probe:
        checks.append(RequirementCheck("version", command.name, False, f"its version probe was not run: {why_not}",
                                       required=False))
        return checks

    shown = " ".join([pin.path, *command.version_probe])
    try:
        done = subprocess.run([pin.path, *command.version_probe], env={}, cwd="/", stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=command.timeout_seconds, check=False)
    except subprocess.TimeoutExpired:
        return [*checks, RequirementCheck("version", command.name, False, f"its version probe ({shown}) did not end "
                                          f"within {command.timeout_seconds:g} s")]
    except OSError as exc:
        return [*checks, RequirementCheck("version", command.name, False, f"its version probe ({shown}) did not "
                                          f"start: {exc.strerror}")]
    text = done.stdout.decode("utf-8", "replace").strip()
    if done.returncode != 0:
        ok, detail = False, f"its version probe ({shown}) exited with status {done.returncode}"
    elif text != command.expected_version:
        ok, detail = False, _difference(command.expected_version, text)
    else:
        ok, detail = True, f"{shown} prints the expected version"
    return [*checks, RequirementCheck("version", command.name, ok, detail)]


def _plugin_check(name: str, folder: str, data: bytes) -> tuple[RequirementCheck, str | None]:
    """The plugin's runtime, or (when its command starts a program in its folder) the payload path of
    that program, whose `#!` line says what it needs."""
    try:
        command = json.loads(data.decode("utf-8")).get("command")
    except (UnicodeDecodeError, ValueError, AttributeError):
        command = None
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        return RequirementCheck("plugin", name, False, "its manifest gives no command to start it"), None
    first = command[0]
    if "/" in first or first.startswith("."):
        return RequirementCheck("plugin", name, True, ""), os.path.normpath(f"{folder}/{first}")
    if first in PYTHON_COMMANDS:
        return RequirementCheck("plugin", name, True, f"runs on heddle's own Python ({first})"), None
    found = shutil.which(first)
    return RequirementCheck("plugin", name, found is not None,
                            f"runs on {found}" if found else f"its runtime {first!r} is not on PATH"), None


def _shebang_check(name: str, path: str, head: bytes) -> RequirementCheck:
    """A program in a plugin's folder: what its `#!` line starts must be here (a program without one
    runs on its own)."""
    if not head.startswith(b"#!"):
        return RequirementCheck("plugin", name, True, f"runs {path} of the plugin folder")
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if not words:
        return RequirementCheck("plugin", name, False, f"{path} has an empty #! line")
    interpreter = words[0]
    if os.path.basename(interpreter) == "env" and len(words) > 1:
        found = shutil.which(words[-1])
        return RequirementCheck("plugin", name, found is not None,
                                f"{path} runs on {found}" if found else f"{path} needs {words[-1]!r}, which is not "
                                "on PATH")
    ok = os.path.isfile(interpreter) and os.access(interpreter, os.X_OK)
    return RequirementCheck("plugin", name, ok, f"{path} runs on {interpreter}" if ok else
                            f"{path} needs {interpreter}, which is not here")


def _sandbox_check() -> RequirementCheck:
    try:
        check_policy(SandboxPolicy(safe=True))  # what a run under --safe checks first: bwrap, and a sandbox made
        problem = None
    except UsageError as exc:
        problem = str(exc)
    return RequirementCheck("sandbox", "bubblewrap", problem is None,
                            "the bundle proposes --safe, and it works here" if problem is None else
                            f"the bundle proposes --safe: {problem}")


def trust_problem(manifest_bytes: bytes, signatures: Any, *, trust: Iterable[str], allow_unsigned: bool,
                  what: str) -> str | None:
    """Why the bundle's signers are not trusted here (None when they are), as `run` would decide."""
    try:
        policy = TrustPolicy.from_names(list(trust), allow_unsigned=allow_unsigned)
        check_signatures(manifest_bytes, signatures, policy.trusted, allow_unsigned=policy.admits_unsigned,
                         what=what)
    except HeddleError as exc:
        return f"{exc} (the probe runs a program with arguments the bundle chose)"
    return None


def check_tracing() -> RequirementCheck:
    """Whether runs here are traced: off, on (to which collector), or asked for without the SDK a run needs."""
    found = endpoint()
    if found is None:
        return RequirementCheck("otel", "tracing", True, f"off ({ENDPOINT_VARIABLES[1]} is not set)", required=False)
    parts = urlsplit(found)
    where = f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"  # never a password
    if not installed():
        return RequirementCheck("otel", "tracing", False, f"spans for {where} need the OpenTelemetry SDK: "
                                f"pip install '{EXTRA}'")
    return RequirementCheck("otel", "tracing", True, f"spans sent to {where} over OTLP/HTTP")
