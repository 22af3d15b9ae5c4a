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
    _.model_config,  # heddle/spec/components.py
    _.branch_name,  # heddle/spec/components.py
    _._none_is_empty,  # heddle/spec/components.py

    # dataclass fields: part of the record a caller gets back
    _.signer,  # heddle/format/pack.py (PackResult)

    # asyncio.SubprocessProtocol: the event loop calls these
    _.pipe_data_received,  # heddle/tools/process.py
    _.pipe_connection_lost,  # heddle/tools/process.py
    _.process_exited,  # heddle/tools/process.py
)
