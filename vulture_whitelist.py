"""Names vulture reports as unused that a framework reads or calls, never heddle's own code.

Checked with: vulture heddle vulture_whitelist.py --min-confidence 60
Only names vulture cannot see used belong here; dead code is removed instead. The file is
never imported or run: vulture reads the names, so any object stands in for the owner.
"""

from types import SimpleNamespace

_ = SimpleNamespace()

USED = (
    # uvicorn.Server: called on a signal, the flag read by its main loop, the handlers it installs
    _.handle_exit,  # heddle/model/scripted.py
    _.force_exit,  # heddle/model/scripted.py, heddle/server/serve.py
    _.capture_signals,  # heddle/server/serve.py

    # uvicorn's request cycle: the route waiting for a body reads it
    _.disconnected,  # heddle/server/connections.py

    # pydantic: the model's configuration, a document field kept as written, a field validator
    _.model_config,  # heddle/agentspec/components.py
    _.branch_name,  # heddle/agentspec/components.py
    _._none_is_empty,  # heddle/agentspec/components.py
    _._check_output_message,  # heddle/agentspec/components.py
    # document fields: read from the raw mapping (refusals, specialisation) or kept as written
    _.api_spec_uri,  # heddle/agentspec/components.py (RemoteTool: describes the API; never fetched)
    _.requires_confirmation,  # heddle/agentspec/refusals.py reads it from the document
    _.configuration,  # heddle/agentspec/refusals.py (BuiltinTool)
    _.executor_name,  # heddle/agentspec/refusals.py (BuiltinTool)
    _.tool_version,  # heddle/agentspec/refusals.py (BuiltinTool)
    _.additional_instructions,  # heddle/agentspec/specialized.py
    _.additional_tools,  # heddle/agentspec/specialized.py
    _.human_in_the_loop,  # heddle/agentspec/refusals.py, heddle/agentspec/specialized.py
    _.agent_specialization_parameters,  # heddle/agentspec/specialized.py

    # dataclass fields: part of the record a caller gets back
    _.signer,  # heddle/format/pack.py (PackResult)

    # asyncio.SubprocessProtocol: the event loop calls these
    _.pipe_data_received,  # heddle/tools/process.py
    _.pipe_connection_lost,  # heddle/tools/process.py
    _.process_exited,  # heddle/tools/process.py

    # the async context-manager protocol: __aexit__ takes the exception's type whether it reads it or not
    _.exc_type,  # heddle/engine/seams.py, heddle/plugin_host/middleware.py, heddle/workspace/workspace.py

    # event records: serialised with every event, read by whoever consumes the stream
    _.ts,  # heddle/engine/events.py

    # a lazily resolved package: Python calls the module's __getattr__ for a missing name
    _.__getattr__,  # heddle/plugin_host/__init__.py, heddle/__init__.py

    # counted for the tests and for --verbose: how often a plugin process was (re)started
    _.starts,  # heddle/plugin_host/process.py

    # the standard library reads it: where tempfile puts every temporary folder
    _.tempdir,  # heddle/server/cli.py

    # commands the CLI's table (heddle/cli/root.py COMMANDS) names by module and attribute
    _.keygen, _.diff, _.doctor,  # heddle/cli/bundle.py
    _.init,  # heddle/cli/run.py

    # click calls these on the command and group classes it is given
    _.format_options, _.format_commands,  # heddle/cli/flags.py, heddle/cli/root.py
    _.format_epilog,  # heddle/server/cli.py
    # typer reads a command function's signature from these
    _.__signature__, _.__annotations__,  # heddle/cli/flags.py, heddle/server/cli.py
    # a sub-app's command given QuickCommand's reading of its options
    _.__class__,  # heddle/cli/flags.py
    # dir(heddle) asks the module for it
    _.__dir__,  # heddle/__init__.py
    # asyncio's Transport API, kept by the coalescing transport so no write can pass its buffer
    _.writelines,  # heddle/server/connections.py
    # set through pydantic's __setattr__, read from the model's private store (heddle/agentspec/roots.py)
    _._root,
    # FileStat's fields: rows are compared whole (heddle/format/snapshot.py), never read by name
    _.dev,
    _.ino,
    _.mtime_ns,
    _.ctime_ns,
    # a Postgres connection's TLS files, read by name with getattr (heddle/engine/pgcache.py)
    _.sslcert,
    _.sslkey,
    _.sslrootcert,
    _.sslcrl,
    # the OpenTelemetry SDK's record of one export, read by its own metrics of exports (heddle/engine/otlp.py)
    _.error_attrs,
    # the OpenTelemetry API's Span, called by whatever holds the current span (heddle/engine/spans.py)
    _.update_name,
    _.add_link,
    _.record_exception,
    _.is_recording,
    # the stand-in for pydantic's plugin loader, which pydantic calls (heddle/shell_options.py)
    _.get_plugins,
    # logging's documented switches, read by the logging module (heddle/server/serve.py)
    _._srcfile,
    _.logThreads,
    _.logProcesses,
    _.logMultiprocessing,
)
