"""Sealing a flow: from a flow document, its tools, mounts and plugins to one signed `.heddle` file.

Everything that can be refused is refused before a byte is written: the flow loads and its
graph checks out against the tools it will carry, the mounts pass the mount rules (their limits
counted as the plan walks them), the plan refuses links and names that look like secrets, and the
signing key is loaded (its passphrase asked for before any file is read, so a wrong one wastes
little). Then the archive is written atomically: on any failure nothing is left at the output path.

`heddle bundle` is this call with its flags parsed; the library calls it as `heddle.seal(...)`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from heddle.agentspec import load_flow
from heddle.agentspec.roots import document_root
from heddle.bundle.egress import parse_flags, parse_secret_flags, read_egress_file, sealed_egress
from heddle.bundle.fingerprints import fingerprints_of
from heddle.bundle.plan import ToolSpec, make_plan
from heddle.errors import GraphError, UsageError
from heddle.format.keys import SigningKey, load_signing_key
from heddle.format.manifest import Proposals
from heddle.format.pack import pack
from heddle.format.replaced import check_replaceable
from heddle.format.verify import collector_paused
from heddle.graph import check_flow
from heddle.plugin_host.carried import read_carried
from heddle.settings import LEVEL, parse_rounds
from heddle.tools.registry import discover_tools
from heddle.workspace.mounts import Mount, check_mounts, parse_mount

if TYPE_CHECKING:
    from heddle.format.manifest import Manifest, Requires
    from heddle.format.progress import Progress
    from heddle.tools.commands import CommandSet

StrPath = str | os.PathLike[str]

# The mount rules' own caps (heddle.workspace.mounts), written here so that reading this
# signature imports nothing.
DEFAULT_MOUNT_MAX_ENTRIES = 4096
DEFAULT_MOUNT_MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class SealResult:
    """A bundle just written: where, under which digest, signed by whom, and what it holds."""

    path: Path
    digest: str  # "sha256:<hex>" of the manifest: the bundle's identity
    name: str
    signers: tuple[str, ...]  # key ids; empty when unsigned
    size: int  # bytes of the .heddle file
    payload_size: int  # bytes of the files sealed, uncompressed
    file_count: int
    skipped: tuple[Path, ...]  # left out on purpose (version-control folders)
    manifest: Manifest
    warnings: tuple[str, ...] = ()  # what the document does that it should not (a newer feature than it declares)


def _proposal(value: int | str | None) -> int | Literal["unlimited"] | None:
    """A tool-round proposal as the manifest records it: a whole number >= 1 or "unlimited"."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UsageError(f"max_tool_rounds {value!r}: give a positive whole number or 'unlimited'")
    rounds = parse_rounds(value)
    return "unlimited" if rounds is None else rounds


def _mounts(mounts: Sequence[str | Mount]) -> list[Mount]:
    parsed: list[Mount] = []
    for mount in mounts:
        if isinstance(mount, str):
            parsed.append(parse_mount(mount))
        elif isinstance(mount, Mount):
            parsed.append(mount)
        else:
            raise UsageError(f"mounts: {mount!r} is neither 'SRC[:DEST][:ro|:rw]' nor a Mount")
    return parsed


def _signing_key(sign_key: StrPath | SigningKey | None) -> SigningKey | None:
    if sign_key is None or isinstance(sign_key, SigningKey):
        return sign_key
    return load_signing_key(Path(sign_key))


@dataclass(frozen=True)
class SealSettings:
    """Everything sealing takes besides the flow, each with its default: `heddle.seal`'s keywords and what
    `heddle bundle`'s flags give, defined here once (see `seal` for what each one means)."""

    output: StrPath | None = None
    tools_dir: StrPath | None = None
    mounts: Sequence[str | Mount] = ()
    plugins: Sequence[StrPath] = ()
    sign_key: StrPath | SigningKey | None = None
    name: str | None = None
    input: Mapping[str, Any] | None = None
    requires: Requires | None = None
    max_tool_rounds: int | str | None = None
    include_secrets: Sequence[StrPath] = ()
    flow_format: str | None = None
    mount_max_entries: int = DEFAULT_MOUNT_MAX_ENTRIES
    mount_max_bytes: int = DEFAULT_MOUNT_MAX_BYTES
    progress: Progress | None = None
    components: StrPath | None = None
    commands: StrPath | None = None
    level: int | None = None
    release: int | None = None
    safe: bool = False
    egress: Sequence[str] = ()
    egress_file: StrPath | None = None
    secrets: Sequence[str] = ()


def seal(flow: StrPath, settings: SealSettings | None = None, /, **given: Any) -> SealResult:
    """Check everything, then write the bundle atomically to `output` and describe it.

    Sealing takes `settings` (a `SealSettings`), the fields `given` by name replacing its own: `output`
    None writes `<name>.heddle` in the working folder. `mounts` are `SRC[:DEST][:ro|:rw]` strings or
    `Mount`s; `plugins` are plugin manifests (read, never started: their settings are given where the
    bundle runs). `sign_key` is a private key
    file from `heddle keygen` (an encrypted one asks for its passphrase through
    HEDDLE_KEY_PASSPHRASE or the terminal) or a loaded `SigningKey`; None seals unsigned.
    `input`, `requires`, `max_tool_rounds` ("unlimited" or a number) and `safe` (every run under the
    tools' sandbox) are recorded as the bundle's proposals. `components` is a file of shared
    components the flow document refers to (`$referenced_components`, as a disaggregated
    configuration has them): it is sealed beside the flow and read with it wherever the bundle
    opens. `commands` is a commands file (heddle.tools.commands) whose commands the flow names as
    tools: it is checked, sealed, and checked again wherever the bundle opens. `level` is the zstd
    level (1 to 22; None: heddle.settings.LEVEL's default); the same inputs at the same level give
    the same manifest and payload on any machine (each signature carries the time it was made).
    `release` is a release number sealed in the manifest: where a tag is followed, a bundle of a
    lower release than the one seen is refused. `egress` (`TOOL=HOST[:PORT][,...]` each) and `egress_file` (a
    YAML or JSON file with an `egress:` mapping) declare the hosts each tool may reach; with the commands
    file's and the plugins' `egress:` sections they seal an allow-list (heddle.bundle.egress); `secrets`
    (`NAME=ENV@HOST[:PORT][,...]` each, and the egress file's `secrets:`) seal the secrets tools use
    through the proxy without holding them. Raises a
    `heddle.HeddleError` naming what is wrong; nothing is written then.
    """
    fields = {f.name for f in dataclasses.fields(SealSettings)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise UsageError(f"seal: {unknown[0]!r} is not a sealing setting; give one of {', '.join(sorted(fields))}")
    settings = dataclasses.replace(settings or SealSettings(), **given)

    chosen_level = LEVEL.default if settings.level is None else settings.level
    # The level is checked with the other arguments, before a byte of the flow is read.
    problem = (LEVEL.problem(chosen_level) if type(chosen_level) is int
               else f"level {chosen_level!r}: give a whole number")
    if problem is not None:
        raise UsageError(problem)
    flow_path = Path(flow)
    tools_root = Path(settings.tools_dir) if settings.tools_dir is not None else None
    plugin_paths = [Path(p) for p in settings.plugins]
    # Plugins are read, never started, to seal them: their settings come at run time.
    carried = read_carried(plugin_paths)
    components_path = Path(settings.components) if settings.components is not None else None
    loaded = load_flow(flow_path, fmt=settings.flow_format, node_types=carried.node_types, components=components_path)
    tools = discover_tools(tools_root)
    declared: CommandSet | None = None
    if settings.commands is not None:
        # Here, not at the top: a commands file is the exception, and its module (schemas, programs, egress
        # sections) would be a share of every other seal's start-up.
        from heddle.tools.commands import read_commands

        declared = read_commands(Path(settings.commands))
    known = {**(declared.known(tools) if declared is not None else tools),
             **dict.fromkeys(carried.tool_names, flow_path)}
    problems = check_flow(loaded, tools=known, tools_dir=tools_root, wiring=False)
    if declared is not None:
        problems += declared.problems(loaded)
    if problems:
        raise GraphError(problems)
    # An input nothing gives is the run's to refuse (before any tool or model call, wherever the
    # bundle runs): the seal is sound, so it is written, and the author told now.
    run_problems = [p for p in check_flow(loaded, tools=known, tools_dir=tools_root) if p not in problems]

    from_file, file_secrets = (read_egress_file(Path(settings.egress_file)) if settings.egress_file is not None
                               else ({}, {}))
    sealed_secrets = parse_secret_flags(settings.secrets, file_secrets)
    sealed_hosts = sealed_egress(loaded, (parse_flags(settings.egress), from_file,
                                          declared.egress if declared is not None else {}, carried.egress),
                                 secrets=sealed_secrets is not None)
    parsed_mounts = _mounts(settings.mounts)
    # A mount's folder is walked once, by the plan, which counts it against the limits as it lists it.
    check_mounts(parsed_mounts, max_entries=settings.mount_max_entries, max_bytes=settings.mount_max_bytes,
                 walk=False)
    # The same fingerprints the verifier recomputes from the sealed flow; a command is described by
    # the manifest's `commands` instead, as a plugin's tool is by its plugin.
    leave_out = {*carried.tool_names, *(declared.commands if declared is not None else ())}
    specs = {tool: ToolSpec(path=tools[tool], fingerprint=fingerprint)
             for tool, fingerprint in fingerprints_of(loaded, leave_out=leave_out).items()}
    proposals = Proposals(max_tool_rounds=_proposal(settings.max_tool_rounds), safe=True if settings.safe else None)
    # A tools folder that does not exist carries nothing; the graph check above already refused
    # a flow that names a tool it would have had to hold.
    carried_tools = tools_root if tools_root is not None and tools_root.exists() else None
    # A plan and a manifest of a big tree are tens of thousands of small objects, none in a cycle: the
    # cyclic collector's passes over them were a tenth of packing one (heddle.format.verify.collector_paused).
    with collector_paused():
        plan = make_plan(
            flow_path, name=settings.name or loaded.name or None, tools_dir=carried_tools, tools=specs,
            mounts=parsed_mounts, plugins=plugin_paths,
            input=dict(settings.input) if settings.input is not None else None, requires=settings.requires,
            proposals=proposals, include_secrets=[Path(p) for p in settings.include_secrets],
            flow_format=settings.flow_format, components=components_path, commands=declared,
            mount_limits=(settings.mount_max_entries, settings.mount_max_bytes),
        )
        out = Path(settings.output) if settings.output is not None else Path(f"{plan.name}.heddle")
        check_replaceable(out, what="-o")
        key = _signing_key(settings.sign_key)
        if settings.release is not None:
            plan = dataclasses.replace(plan, release=settings.release)
        if sealed_hosts is not None:
            plan = dataclasses.replace(plan, egress=sealed_hosts, secrets=sealed_secrets)
        packed = pack(plan, out, signing_key=key, progress=settings.progress, level=chosen_level)
    return SealResult(
        path=packed.path,
        digest=f"sha256:{packed.digest}",
        name=packed.manifest.name,
        signers=(key.keyid,) if key is not None else (),
        size=packed.size,
        payload_size=packed.payload_size,
        file_count=packed.file_count,
        skipped=tuple(packed.skipped),
        manifest=packed.manifest,
        warnings=(*document_root(loaded).warnings, *(f"a run of it will be refused: {p}" for p in run_problems),
                  *(declared.warnings if declared is not None else ())),
    )
