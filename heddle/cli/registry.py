"""`heddle push` and `heddle pull`: a bundle to and from an OCI registry (heddle.oci)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from heddle.cli import output
from heddle.cli.flags import takes
from heddle.cli.output import QUIET, VERBOSE, json_option

_CACHE_DIR = typer.Option(
    None, "--cache-dir",
    help="The cache the pulled bundle is kept in [default: $HEDDLE_CACHE_DIR or ~/.cache/heddle/bundles].",
)


def _annotations(given: list[str]) -> dict[str, str]:
    from heddle.errors import UsageError

    out: dict[str, str] = {}
    for item in given:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--annotation {item!r}: write KEY=VALUE, such as "
                             "org.opencontainers.image.source=https://example.com/repo")
        if key in out:
            raise UsageError(f"--annotation {key}: given twice; give each key once")
        out[key] = value
    return out


@takes("plain_http")
def push(
    bundle: Path = typer.Argument(..., metavar="BUNDLE", help="The .heddle file to push; it is sent unchanged."),
    reference: str = typer.Argument(..., metavar="oci://REGISTRY/REPO[:TAG]",
                                    help="Where to push it; without a tag it is pushed by digest alone."),
    annotation: list[str] = typer.Option([], "--annotation", metavar="KEY=VALUE",
                                         help="Add an annotation to the artifact's manifest (repeatable)."),
    json_out: bool = json_option("Print the reference, the OCI digest and the bundle digest as JSON."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    plain_http: bool,
) -> None:
    """Push a bundle to an OCI registry as the one layer of an artifact, and print its OCI
    manifest digest and its bundle digest.

    The artifact's type is application/vnd.heddle.bundle.v1; its annotations carry the bundle's
    digest, its name and the time it was sealed, so one file pushed twice is one artifact.
    Credentials: HEDDLE_REGISTRY_USERNAME and HEDDLE_REGISTRY_PASSWORD, else the docker config
    (~/.docker/config.json, as `docker login` writes it). Nothing is verified here: where it is
    pulled, it is verified against the keys trusted there.

    \b
    Example:
      heddle push app.heddle oci://registry.example.com/agents/app:1.0 --annotation team=search
    """
    from heddle.cli.progress import terminal_progress
    from heddle.oci import push as push_bundle

    output.use(quiet=quiet, verbose=verbose)
    pushed = push_bundle(bundle, reference, annotations=_annotations(annotation), plain_http=plain_http,
                         progress=None if json_out else terminal_progress())
    if json_out:
        output.print_json({
            "bundle": str(bundle), "reference": str(pushed.reference), "pinned": str(pushed.pinned),
            "oci_digest": pushed.oci_digest, "bundle_digest": pushed.bundle_digest, "size": pushed.size,
            "annotations": dict(pushed.annotations),
        })
        return
    typer.echo(f"pushed {bundle} to {pushed.reference}")
    typer.echo(f"  oci digest     {pushed.oci_digest}")
    typer.echo(f"  bundle digest  {pushed.bundle_digest}")
    typer.echo(f"  pinned         {pushed.pinned}")


def _write_copy(source: Path, dest: Path) -> None:
    """Copy `source` to `dest` in one rename: nothing half-written is ever at `dest`."""
    from contextlib import ExitStack

    from heddle.errors import UsageError
    from heddle.format.replaced import replaced, umasked

    with ExitStack() as stack:
        try:
            out = stack.enter_context(replaced(dest, prefix=f".{dest.name}.", suffix=".part", mode=umasked(0o666),
                                               what="-o"))
        except OSError as exc:
            raise UsageError(f"-o {dest}: cannot write in {dest.parent}: {exc.strerror}") from None
        with open(source, "rb") as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)


@takes("plain_http", "offline", "allow_downgrade", "transfer_timeout")
def pull(
    reference: str = typer.Argument(..., metavar="REFERENCE",
                                    help="oci://REGISTRY/REPO:TAG, oci://REGISTRY/REPO@sha256:DIGEST, or an https:// "
                                         "URL of a .heddle file."),
    out: Path = typer.Option(..., "-o", "--output", metavar="FILE", help="Where to write the bundle."),
    cache_dir: Path | None = _CACHE_DIR,
    json_out: bool = json_option("Print the reference, its OCI digest, the bundle digest and the file as JSON."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    plain_http: bool,
    offline: bool,
    allow_downgrade: bool,
    transfer_timeout: str | None,
) -> None:
    """Download a bundle from a registry (or a URL) to FILE, byte for byte.

    The blob is checked against its OCI digest while it streams, and must be a bundle; it is
    kept in the cache by that digest, so a second pull of the same digest asks the registry
    for nothing but the tag. Its signature is not checked here: `heddle verify FILE` (or run
    it) checks it against the keys you trust. A bundle signed before (or of a lower release than,
    or another agent than) the one last seen under the tag here is refused unless --allow-downgrade.
    """
    from heddle.errors import UsageError
    from heddle.format.verify import peek
    from heddle.oci import pull as pull_bundle
    from heddle.oci.reference import looks_like_reference, parse_reference
    from heddle.oci.seen import check_seen

    output.use(quiet=quiet, verbose=verbose)
    if not looks_like_reference(reference):
        raise UsageError(f"{reference}: not a reference; heddle pull takes oci://REGISTRY/REPO:TAG, "
                         "oci://REGISTRY/REPO@sha256:DIGEST or an https:// URL")
    from heddle.format.replaced import check_replaceable

    check_replaceable(out, what="-o")  # before anything is downloaded
    from heddle.cli.target import transfer_seconds
    from heddle.oci import TRANSFER_TIMEOUT_S

    timeout = transfer_seconds(transfer_timeout)
    from heddle.cli.progress import terminal_progress

    pulled = pull_bundle(parse_reference(reference), plain_http=plain_http, offline=offline, cache_dir=cache_dir,
                         timeout=TRANSFER_TIMEOUT_S if timeout is None else timeout,
                         progress=None if json_out else terminal_progress())
    accepted = check_seen(pulled, allow_downgrade=allow_downgrade, cache_dir=cache_dir)
    if accepted is not None:
        output.warn(accepted)
    digest = peek(pulled.path).digest
    _write_copy(pulled.path, out)
    bundle_digest = f"sha256:{digest}" if digest else None
    if json_out:
        output.print_json({"reference": reference, "oci_digest": pulled.oci_digest, "bundle_digest": bundle_digest,
                           "output": str(out), "downloaded": pulled.downloaded,
                           "size": os.stat(out).st_size})
        return
    typer.echo(f"pulled {reference} to {out}")
    if pulled.oci_digest:
        typer.echo(f"  oci digest     {pulled.oci_digest}")
    typer.echo(f"  bundle digest  {bundle_digest or 'none (a format-1 bundle)'}")
    output.note(f"not verified yet: `heddle verify {out}` checks its signature against the keys you trust")
