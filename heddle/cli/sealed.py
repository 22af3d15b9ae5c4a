"""The CLI side of bundles that needs the engine: `heddle bundle` (plan from a flow, then seal)
and opening a bundle for `heddle run` / `heddle validate`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from heddle.errors import GraphError, UsageError


def seal(
    flow_path: Path,
    *,
    tools_dir: Path | None,
    mounts: list[str],
    plugins: list[Path],
    input_text: str | None,
    requires: str | None,
    max_tool_rounds: str | None,
    sign_key: Path | None,
    name: str | None,
    fmt: str | None,
    output: Path | None,
    max_entries: int,
    max_bytes: int,
    read_input: Callable[[str | None], dict],
    include_secrets: list[Path] | None = None,
) -> None:
    """Check everything, then write the bundle atomically and report it."""
    from heddle.format.keys import load_signing_key
    from heddle.format.manifest import Proposals
    from heddle.bundle.plan import ToolSpec, make_plan
    from heddle.cli.progress import terminal_progress
    from heddle.bundle.requires import parse_requires
    from heddle.format.pack import pack
    from heddle.cli.bundle import print_pack_result
    from heddle.engine.options import parse_max_tool_rounds
    from heddle.bundle.fingerprints import fingerprints_of
    from heddle.graph import check_flow
    from heddle.plugin_host.carried import read_carried
    from heddle.spec import load_flow
    from heddle.tools.registry import discover_tools
    from heddle.workspace.mounts import check_mounts, parse_mount

    # Plugins are read, never started, to seal them: their settings come at run time.
    carried = read_carried(plugins)
    flow = load_flow(flow_path, fmt=fmt, node_types=carried.node_types)
    tools = discover_tools(tools_dir)
    problems = check_flow(flow, tools={**tools, **dict.fromkeys(carried.tool_names, flow_path)},
                          tools_dir=tools_dir)
    if problems:
        raise GraphError(problems)
    parsed_mounts = [parse_mount(m) for m in mounts]
    check_mounts(parsed_mounts, max_entries=max_entries, max_bytes=max_bytes)
    # The same fingerprints the verifier recomputes from the sealed flow.
    specs = {name_: ToolSpec(path=tools[name_], fingerprint=fingerprint)
             for name_, fingerprint in fingerprints_of(flow, leave_out=carried.tool_names).items()}
    proposal: int | str | None = None
    if max_tool_rounds is not None:
        rounds = parse_max_tool_rounds(max_tool_rounds)
        proposal = "unlimited" if rounds is None else rounds
    # Ask for a passphrase before any work, so a wrong one wastes nothing.
    key = load_signing_key(sign_key) if sign_key is not None else None
    # A tools folder that does not exist carries nothing; the graph check above already refused
    # a flow that names a tool it would have had to hold.
    carried_tools = tools_dir if tools_dir is not None and tools_dir.exists() else None
    plan = make_plan(
        flow_path, name=name or flow.name or None, tools_dir=carried_tools, tools=specs, mounts=parsed_mounts,
        plugins=plugins, input=read_input(input_text) if input_text is not None else None,
        requires=parse_requires(requires) if requires is not None else None,
        proposals=Proposals(max_tool_rounds=proposal), include_secrets=include_secrets or (), flow_format=fmt,
    )
    out = output if output is not None else Path(f"{plan.name}.heddle")
    if out.exists() and out.is_dir():
        raise UsageError(f"-o {out}: is a folder; give the path of the .heddle file to write")
    result = pack(plan, out, signing_key=key, progress=terminal_progress())
    print_pack_result(result)


def load_sealed(target: Path, *, trust: list[Path], allow_unsigned: bool, data_dir: Path | None,
                fmt: str | None, verbose: bool, seed_data: bool = True, node_types: Any = ()) -> Any:
    """Verify the bundle and return a `SealedRun`; say where rw mounts were seeded."""
    from heddle.cli.progress import terminal_progress
    from heddle.bundle.runnable import open_runnable

    sealed = open_runnable(target, trust=trust, allow_unsigned=allow_unsigned, data_dir=data_dir,
                           seed_data=seed_data, fmt=fmt, progress=terminal_progress(), node_types=node_types)
    if getattr(sealed, "repaired", None):
        sys.stderr.write(f"warning: the cached copy of {target} could not be proved ({sealed.repaired}); "
                         "it was removed and the bundle verified again\n")
    if verbose:
        who = ", ".join(sealed.signers) or "nobody (unsigned, admitted by --allow-unsigned)"
        sys.stderr.write(f"verified {target}: sha256:{sealed.digest}, signed by {who}\n")
    if seed_data and any(m.mode == "rw" for m in sealed.mounts):
        sys.stderr.write(f"rw mounts are seeded in {sealed.data_dir}\n")
    return sealed
