"""`heddle sessions ls|show|rm`, and what `heddle run --session` shares with them: opening the store
the session flags name and peeking at a session before a run (the answer flags are read in
heddle.cli.answers)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from heddle.cli import output
from heddle.cli.flags import SettingsCommand, takes
from heddle.cli.output import QUIET, VERBOSE, json_option
from heddle.settings import RunSettings  # at run time: @takes reads the commands' annotations
from heddle.textsafe import printable, printable_json

if TYPE_CHECKING:
    from heddle.plugin_host.host import PluginHost
    from heddle.sessions.record import Pending
    from heddle.sessions.seal import SealedStore
    from heddle.sessions.store import SessionStore

T = TypeVar("T")

# The settings that say where sessions are; `--durable` is a run's, not a store's.
STORE_SETTINGS = ("session_store", "session_db", "session_dir", "session_key")


def open_cli_store(settings: RunSettings, *, plugins: PluginHost | None = None) -> SealedStore:
    """The store the session flags name (sqlite unless --session-store says otherwise), opened and
    reachable; a flag for another kind of store than the one chosen is refused, not ignored."""
    from heddle.errors import UsageError
    from heddle.sessions.open import open_store

    spec = settings.session_store or "sqlite"
    if settings.session_db is not None and spec != "sqlite":
        raise UsageError("--session-db is the file of the sqlite session store; it does not apply to "
                         "--session-store " + _shown(spec) + " (drop one of them)")
    if settings.session_dir is not None and spec != "file":
        raise UsageError("--session-dir is the folder of the file session store; it does not apply to "
                         "--session-store " + _shown(spec) + " (drop one of them, or give --session-store file)")
    return open_store(spec, db=settings.session_db, directory=settings.session_dir, plugins=plugins,
                      key_file=settings.session_key)


def _shown(spec: str) -> str:
    # A postgres URL may carry a password: only its scheme is ever printed.
    return spec.split("://", 1)[0] + "://..." if "://" in spec else spec


async def pending_run(store: SessionStore, session: str) -> Pending | None:
    """The session's unfinished run (waiting, or a --durable run that stopped), or None: a new session,
    or one whose last run finished."""
    from heddle.sessions.record import decode

    stored = await store.get(session)
    return None if stored is None else decode(session, stored.data, store=store.name).pending


# --------------------------------------------------------------------------- heddle sessions

sessions_app = typer.Typer(
    name="sessions",
    help="The sessions `heddle run --session NAME` keeps: list, show and remove them (the sqlite store under "
         "$XDG_DATA_HOME/heddle unless --session-store says otherwise).",
    no_args_is_help=True,
    rich_markup_mode=None,
)

_NAME = typer.Argument(..., metavar="NAME", help="The session's name (as given to heddle run --session).")


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def _waits(summary: dict[str, Any]) -> str:
    waiting = summary.get("waiting_for")
    if not waiting:
        return "-"
    tool = f" ({waiting['tool']})" if waiting.get("tool") else ""
    return f"{waiting['kind']}{tool} at {waiting['node']!r}"


def _using_store(settings: RunSettings, work: Callable[[SealedStore], Awaitable[T]]) -> tuple[T, str]:
    """`work` done on the store `settings` name, and the store's name: its plugins loaded first (a
    `plugin:` store), all in one event loop, and both closed after."""
    import asyncio

    from heddle.core import load_plugins

    host = load_plugins(settings)

    async def main() -> tuple[T, str]:
        try:
            store = open_cli_store(settings, plugins=host)
            try:
                output.detail(f"session store: {store.name}")
                return await work(store), store.name
            finally:
                await store.close()
        finally:
            if host is not None:
                await host.aclose()

    return asyncio.run(main())


@sessions_app.command("ls", cls=SettingsCommand)
@takes(*STORE_SETTINGS, "plugins", "plugin_configs")
def sessions_ls(
    json_out: bool = json_option("Print the sessions as a JSON array (what each is, never its journal)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    settings: RunSettings,
) -> None:
    """List the sessions, most recently used first: name, status, turns, last use, what each waits for."""
    from heddle.errors import SessionError
    from heddle.sessions.record import decode

    output.use(quiet=quiet, verbose=verbose)
    surveyed, where = _using_store(settings, lambda store: store.survey())
    rows: list[dict[str, Any]] = []
    for stored, refused in surveyed:
        try:
            if refused is not None:
                raise refused
            rows.append(decode(stored.id, stored.data, store=where).summary())
        except SessionError as exc:
            # Listed, not hidden: `rm` is how a person gets rid of it.
            output.warn(exc.message)
            rows.append({"id": stored.id, "status": "unreadable", "updated": stored.updated})
    if json_out:
        output.print_json(rows)
        return
    if not rows:
        output.note(f"no sessions in {where}")
        return
    table = [("NAME", "STATUS", "TURNS", "UPDATED", "WAITS FOR", "DOCUMENT")]
    table += [(r["id"], r["status"], str(r.get("turns", "-")), _when(r["updated"]), _waits(r),
               str(r.get("document", "-"))) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        sys.stdout.write(printable("  ".join([*cells, row[-1]])) + "\n")


@sessions_app.command("show", cls=SettingsCommand)
@takes(*STORE_SETTINGS, "plugins", "plugin_configs")
def sessions_show(
    name: str = _NAME,
    json_out: bool = json_option("Print the session as a JSON object (what it is, never its journal)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    settings: RunSettings,
) -> None:
    """Show one session: the document it belongs to, its turns, and what its run waits for."""
    from heddle.sessions.record import decode
    from heddle.sessions.store import check_session_id, not_found

    output.use(quiet=quiet, verbose=verbose)
    check_session_id(name)
    stored, where = _using_store(settings, lambda store: store.get(name))
    if stored is None:
        raise not_found(name, store=where)
    summary = decode(name, stored.data, store=where).summary()
    if json_out:
        output.print_json(summary)
        return

    def out(text: str) -> None:
        # The prompt and the arguments are a document's or a model's.
        sys.stdout.write(printable(text))

    out(f"session   {summary['id']} in {where}\n")
    out(f"status    {summary['status']}\n")
    out(f"document  {summary['document']} ({summary['digest']})\n")
    out(f"turns     {summary['turns']}\n")
    out(f"created   {_when(summary['created'])}\n")
    out(f"updated   {_when(summary['updated'])}\n")
    waiting = summary.get("waiting_for")
    if waiting:
        out(f"waits for {waiting['kind']} at node {waiting['node']!r}\n")
        if waiting.get("tool") is not None:
            arguments = printable_json(json.dumps(waiting.get("arguments") or {}, ensure_ascii=False))
            out(f"tool      {waiting['tool']} {arguments}\n")
        if waiting.get("prompt") is not None:
            out(f"prompt    {waiting['prompt']}\n")


@sessions_app.command("rm", cls=SettingsCommand)
@takes(*STORE_SETTINGS, "plugins", "plugin_configs")
def sessions_rm(
    name: str = _NAME,
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    settings: RunSettings,
) -> None:
    """Remove a session: its conversation and any run it has waiting."""
    from heddle.sessions.store import check_session_id, not_found

    output.use(quiet=quiet, verbose=verbose)
    check_session_id(name)
    removed, where = _using_store(settings, lambda store: store.delete(name))
    if not removed:
        raise not_found(name, store=where)
    output.note(f"removed session {name!r} from {where}")
