"""`heddle model`: the scripted model server, for deterministic agent tests and demos.

Only typer and the standard library are imported here; the server is imported when a command runs.
"""

from pathlib import Path
from typing import Annotated

import typer

model_app = typer.Typer(
    name="model",
    help="Serve a scripted, OpenAI-compatible model for deterministic agent tests.",
    no_args_is_help=True,
    add_completion=False,
)


@model_app.callback()
def _group() -> None:
    """Serve a scripted, OpenAI-compatible model for deterministic agent tests."""
    # A callback keeps `serve` a subcommand even though it is the only one.


@model_app.command("serve")
def serve(
    script: Annotated[Path, typer.Option("--script", help="JSON or YAML list of answers, one per request.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on; 0 picks a free one.")] = 0,
    record: Annotated[
        Path | None, typer.Option(help="Append each request as a JSON line {path, headers, body} to FILE.")
    ] = None,
    loop: Annotated[
        bool, typer.Option("--loop", help="Start the script again from the top once used up, instead of answering 500.")
    ] = False,
) -> None:
    """Serve SCRIPT as an OpenAI-compatible model.

    Answers chat-completions requests from SCRIPT, prints its base URL on one line on stdout once
    listening (with --port 0, the port the OS picked), and runs until stopped.
    """
    # Errors (bad script, port in use) propagate as HeddleError for the top-level CLI to report.
    from heddle.model.scripted import load_script
    from heddle.model.scripted import serve as serve_script

    serve_script(load_script(script), host=host, port=port, record_path=record, loop=loop)
