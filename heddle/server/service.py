"""What one server runs, prepared once at start-up, and how a request becomes a prepared run.

A server runs either one sealed bundle (requests carry only inputs) or the flows requests
name: inline, or by `flowPath` under `--flows-root`, with `--tools-dir` tools and, when
allowed, tools sent in the request.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.errors import HeddleError
from heddle.server.admission import Admission
from heddle.server.config import ServerConfig
from heddle.server.errors import ApiError, bad_request
from heddle.server.metrics import REQUEST_TOOL, Metrics
from heddle.server.model_policy import ModelPolicy, check_allow_net
from heddle.server.request_code import ToolFolder
from heddle.server.run_request import RunRequest, missing_inputs, parse_run_request
from heddle.server.served_bundle import digest_of
from heddle.settings import RunSettings

if TYPE_CHECKING:
    from heddle.engine.run import PreparedRun


@dataclass
class Job:
    """One admitted request, prepared and ready to run. `close()` removes what it wrote."""

    prepared: PreparedRun
    inputs: dict[str, Any]
    known_tools: frozenset[str]
    folder: ToolFolder | None = None
    message: str | None = None  # the user's message, for an agent document

    @property
    def flow_name(self) -> str:
        return self.prepared.flow.name

    def tool_label(self, tool: str) -> str:
        return tool if tool in self.known_tools else REQUEST_TOOL

    def close(self) -> None:
        if self.folder is not None:
            self.folder.close()
            self.folder = None


@dataclass
class _Resolved:
    flow: Any
    tools: dict[str, Path]
    tools_dir: Path | None
    source: str
    from_request: bool
    folder: ToolFolder | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    message: str | None = None


def run_settings(config: ServerConfig, sealed: Any = None) -> RunSettings:
    """The settings of every run of this server: with a bundle, settled as `heddle run` settles
    them (its proposals yield to flags given; its own mounts and plugins come first)."""
    from heddle.settings import settle

    if sealed is None:
        return config.settings
    return settle(config.settings, {"max_tool_rounds": sealed.max_tool_rounds}, given=config.given,
                  mounts=sealed.mounts, plugins=getattr(sealed, "plugins", ()))


def load_plugins(config: ServerConfig, sealed: Any = None) -> Any:
    """One PluginHost for the whole server (a bundle's own plugins first, then --plugin), or None.
    Manifests are read and settings checked now; plugin processes start on first use."""
    settings = run_settings(config, sealed)
    if not settings.plugins:
        return None
    from heddle.plugin_host import PluginHost

    # keep_running: the processes serve every run of this server and stop with it (Service.aclose).
    return PluginHost.load(list(settings.plugins), config_specs=settings.plugin_configs,
                           timeout=settings.plugin_timeout, max_node_attempts=settings.max_node_attempts,
                           keep_running=True)


def run_options(config: ServerConfig, sealed: Any = None) -> Any:
    """The engine's RunOptions for every run of this server, its messages in the server's units."""
    from heddle.surface import SERVER

    return run_settings(config, sealed).run_options(surface=SERVER)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


class Service:
    """The server's state: its configuration, what it runs, its run slots and its metrics."""

    def __init__(self, config: ServerConfig, *, sealed: Any = None) -> None:
        from heddle.engine.run import prepare_run
        from heddle.tools.registry import discover_tools
        from heddle.workspace.sandbox import check_policy
        from heddle.workspace.workspace import Workspaces

        self.config = config
        self.sealed = sealed
        self.metrics = Metrics(config.max_concurrent)
        self.admission = Admission(config.max_concurrent, self.metrics)
        self.policy = ModelPolicy(allow_net=check_allow_net(config.allow_net), default_url=config.llm_default_url,
                                  default_key=config.llm_default_key if config.llm_default_url else None)
        if sealed is not None:
            self.tools: dict[str, Path] = dict(sealed.tools)
            self.tools_dir: Path | None = sealed.tools_dir
        else:
            self.tools = discover_tools(config.tools_dir)
            self.tools_dir = config.tools_dir.absolute() if config.tools_dir else None
        self.host = load_plugins(config, sealed)
        self.node_types: frozenset[str] = self.host.node_types() if self.host is not None else frozenset()
        self.options = run_options(config, sealed)
        # Everything that can be refused without a request is refused now, before the port opens.
        check_policy(self.options.sandbox, explicitly_set=config.sandbox_flags)
        Workspaces(self.options.workspace, self.tools, tools_dir=self.tools_dir, warn=lambda message: None).check()
        self.bundle_run = None
        if sealed is not None:
            self.bundle_run = prepare_run(sealed.flow, tools=self.tools, tools_dir=self.tools_dir,
                                          options=self.options, sandbox_flags=config.sandbox_flags,
                                          plugins=self.host)
            self.policy.assign_keys(sealed.flow, self.bundle_run.endpoints, from_request=False)

    # ------------------------------------------------------------------ requests

    def _refuse_for_bundle(self, request: RunRequest) -> None:
        named = [name for name, given in (("flow", request.flow is not None),
                                          ("flowPath", request.flow_path is not None),
                                          ("tools", bool(request.tools))) if given]
        if named:
            raise bad_request(f"request field {named[0]!r}: this server runs the bundle {self.sealed.name!r} "
                              f"({digest_of(self.sealed)}) and nothing else; send only 'inputs'", "bundle_only")

    async def _resolve(self, body: dict[str, Any]) -> _Resolved:
        from heddle.server.documents import flow_from_file, flow_from_value

        request = parse_run_request(body, allow_request_code=self.config.allow_request_code)
        if self.sealed is not None:
            self._refuse_for_bundle(request)
            return _Resolved(self.sealed.flow, self.tools, self.tools_dir, f"bundle {self.sealed.name}",
                             False, inputs={**self.sealed.input, **request.inputs}, message=request.message)
        if request.flow is not None:
            flow = await asyncio.to_thread(flow_from_value, request.flow, node_types=self.node_types)
            source, from_request = "flow", True
        elif request.flow_path is not None:
            if self.config.flows_root is None:
                raise bad_request("request field 'flowPath': this server has no --flows-root; send the "
                                  "document itself as 'flow'", "no_flows_root")
            flow = await asyncio.to_thread(flow_from_file, self.config.flows_root, request.flow_path,
                                           node_types=self.node_types)
            source, from_request = f"flowPath {request.flow_path}", False
        else:
            raise bad_request("the request names no flow; give 'flow' (the document) or 'flowPath'")
        tools, tools_dir, folder = dict(self.tools), self.tools_dir, None
        if request.tools:
            clash = sorted(t.name for t in request.tools if t.name in tools)
            if clash:
                raise bad_request(f"tools: {clash[0]!r} is already a tool of this server; give yours another name")
            folder = await asyncio.to_thread(ToolFolder, request.tools, parent=self.config.work_dir)
            tools.update(folder.tools)
            tools_dir = tools_dir or folder.root
        return _Resolved(flow, tools, tools_dir, source, from_request, folder, dict(request.inputs),
                         request.message)

    async def prepare(self, body: dict[str, Any]) -> Job:
        """The request as a job ready to run, or the 400 saying what is wrong with it."""
        from heddle.engine.inputs import input_problem
        from heddle.spec.roots import check_message

        resolved = await self._resolve(body)
        try:
            check_message(resolved.flow, resolved.message, named="request field 'message'",
                          give="'message' in the request", source=f"the {resolved.source}")
            prepared = self.bundle_run or await self._prepare(resolved)
            missing = missing_inputs(resolved.flow, resolved.inputs)
            if missing:
                names = ", ".join(repr(m) for m in missing)
                raise bad_request(f"inputs: the flow {resolved.flow.name!r} needs {names}; send "
                                  f'{{"inputs": {{"{missing[0]}": ...}}}}', "missing_input")
            problem = input_problem(resolved.flow, resolved.inputs)
            if problem is not None:
                raise bad_request(f"inputs: {problem} (as the flow {resolved.flow.name!r} declares in its "
                                  "StartNode); send values of the declared types", "invalid_input")
        except BaseException:
            if resolved.folder is not None:
                resolved.folder.close()
            raise
        # The server's plugins, if any, are in `prepared`: its runs go through their seams.
        return Job(prepared, resolved.inputs, frozenset(self.tools) | self._plugin_tools(), resolved.folder,
                   resolved.message)

    async def _prepare(self, resolved: _Resolved) -> Any:
        from heddle.engine.run import prepare_run

        if resolved.from_request:
            await self.policy.check_request_flow(resolved.flow)
        prepared = await asyncio.to_thread(
            prepare_run, resolved.flow, tools=resolved.tools, tools_dir=resolved.tools_dir,
            options=self.options, sandbox_flags=self.config.sandbox_flags, plugins=self.host)
        self.policy.assign_keys(resolved.flow, prepared.endpoints, from_request=resolved.from_request)
        return prepared

    async def validate(self, body: dict[str, Any]) -> dict[str, Any]:
        """The validation report for the request's flow (or the bundle's); nothing runs."""
        from heddle.validation import validation_report

        resolved = await self._resolve(body)
        try:
            tools = self.host.known_tools(resolved.tools) if self.host is not None else resolved.tools
            report = validation_report(resolved.flow, tools=tools, source=resolved.source,
                                       tools_dir=resolved.tools_dir)
            if self.sealed is not None:
                report["bundle"] = {"name": self.sealed.name, "digest": digest_of(self.sealed)}
            if self.host is not None:
                report["plugins"] = self.plugin_rows()
            if report["valid"]:
                # What the graph check cannot see: model URLs and keys, sandbox, mounts, plugins.
                try:
                    await self._prepare(resolved)
                except (ApiError, HeddleError) as exc:
                    report["problems"].append(exc.message)
                report["valid"] = not report["problems"]
        finally:
            if resolved.folder is not None:
                resolved.folder.close()
        return report

    # ------------------------------------------------------------------ plugins

    def _plugin_tools(self) -> frozenset[str]:
        return frozenset(self.host.tools) if self.host is not None else frozenset()

    def protocols(self) -> list[str]:
        """How a run's events can be rendered: heddle's own, and each loaded encoder plugin's."""
        return ["heddle", *sorted(self.host.encoders if self.host is not None else ())]

    def encoder(self, protocol: str | None) -> Any:
        """The encoder component for `?protocol=`, None for heddle's own events, or the 400."""
        if protocol is None or protocol == "heddle":
            return None
        component = self.host.encoders.get(protocol) if self.host is not None else None
        if component is None:
            raise bad_request(f"query parameter protocol={protocol!r}: no such protocol; this server has: "
                              + ", ".join(self.protocols()), "unknown_protocol")
        return component

    def plugin_rows(self) -> list[dict[str, Any]]:
        """The loaded plugins as a caller may see them (without where their files are)."""
        assert self.host is not None
        return [{k: v for k, v in row.items() if k != "manifest"} for row in self.host.describe()]

    async def aclose(self) -> None:
        """Stop the plugin processes, remove their homes and the bundle's temporary data folder."""
        from heddle.server.served_bundle import close_served

        try:
            if self.host is not None:
                await self.host.aclose()
        finally:
            close_served(self.sealed)

    # ------------------------------------------------------------------ description

    def capabilities(self) -> dict[str, Any]:
        from heddle import __version__
        from heddle.engine.events import EVENT_TYPES

        config, options = self.config, self.options
        caps: dict[str, Any] = {
            "version": __version__,
            "allowRequestCode": config.allow_request_code,
            "acceptsFlowPath": self.sealed is None and config.flows_root is not None,
            "acceptsFlow": self.sealed is None,
            "sandbox": {"safe": options.sandbox.safe, "backend": options.sandbox.backend,
                        "denyNet": options.sandbox.deny_net},
            "tools": sorted(self.tools),
            "protocols": self.protocols(),
            "events": list(EVENT_TYPES),
            "limits": {
                "maxConcurrent": config.max_concurrent,
                "timeoutMs": _ms(options.timeout),
                "toolTimeoutMs": _ms(options.tool_timeout),
                "maxIterations": options.max_iterations,
                "maxToolRounds": options.max_tool_rounds,
                "maxParallel": options.max_parallel,
                "maxBodyBytes": config.max_body_bytes,
                "drainTimeoutMs": _ms(config.drain_timeout),
                "headerTimeoutMs": _ms(config.header_timeout),
                "bodyTimeoutMs": _ms(config.body_timeout),
                "maxConnections": config.max_connections,
                "mountMaxBytes": options.workspace.max_bytes,
                "mountMaxEntries": options.workspace.max_entries,
            },
            "runsInFlight": self.admission.active,
            "runSaturation": self.admission.saturation,
            "draining": self.admission.draining,
        }
        if self.host is not None:
            caps["plugins"] = self.plugin_rows()
        if self.sealed is not None:
            caps["bundle"] = {"name": self.sealed.name, "digest": digest_of(self.sealed),
                              "signers": list(self.sealed.signers), "tools": dict(self.sealed.tool_fingerprints)}
        return caps
