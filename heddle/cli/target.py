"""Whether a path on the command line is a bundle or a flow: decided one way, for every command.

A bundle runs only once its seal is proved; a flow runs as written, with this machine's API
keys. So the choice is never a guess from the bytes alone: a path whose name ends in
`.heddle`, or one given with an option that only a bundle takes, must be a bundle or it is
refused (exit 7); a flow is read only from a `.json`, `.yaml` or `.yml` path, or from any path
given with `--flow`. A file that starts like a bundle is opened as one whatever its name: that
only ever adds the proof.

The path is looked at through `safeparse.open_regular`, so a FIFO or a device is refused from
its stat and never blocks the command.

A reference (`oci://REGISTRY/REPO:TAG`, `oci://REGISTRY/REPO@sha256:...`, an `https://` URL) is
always a bundle: it is pulled into the cache (heddle.oci) and the file found there is then
opened exactly as a local bundle is, so nothing about where it came from weakens its proof.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from heddle.errors import UsageError

BUNDLE_SUFFIX = ".heddle"
FLOW_SUFFIXES = (".json", ".yaml", ".yml")
BUNDLE_OPTIONS = "--trust, --allow-unsigned and --data-dir"
_BOTH_WAYS = "run a flow from a .json, .yaml or .yml file, or pass --flow PATH to read any file as a flow"


@dataclass(frozen=True)
class Target:
    path: Path
    is_bundle: bool
    reference: str | None = None  # as given, when the bundle was pulled
    oci_digest: str | None = None
    seen_key: str | None = None  # the tag or URL it is remembered under once verified (Remote.seen)

    @property
    def name(self) -> str:
        """How messages name the target: its reference, else its path."""
        return self.reference or str(self.path)


@dataclass(frozen=True)
class Remote:
    """How a reference is pulled: the flags that only a reference takes, and the cache it goes to."""

    plain_http: bool = False
    offline: bool = False
    cache_dir: Path | None = None
    # A tag or URL is compared with the bundle last seen under it, and remembered (heddle.oci.seen):
    # what `run` and `pull` ask for. `allow_downgrade` accepts an older bundle or another agent.
    seen: bool = False
    allow_downgrade: bool = False
    timeout: float | None = None  # --transfer-timeout, in seconds; None: its default


def transfer_seconds(text: str | None) -> float | None:
    """`--transfer-timeout` as given (None when it was not), in seconds."""
    if text is None:
        return None
    from heddle.settings import TRANSFER_TIMEOUT

    seconds: float = TRANSFER_TIMEOUT.parse(text, plain="s")[0]
    return seconds


def bundle_target(text: str | Path, remote: Remote = Remote()) -> Target:
    """A command's BUNDLE argument: a path, as it is, or a reference pulled into the cache (and
    said so on stderr). `--plain-http`/`--offline` with a path are refused."""
    from heddle.oci import TRANSFER_TIMEOUT_S, source

    pulled = source(text if isinstance(text, str) else Path(text), plain_http=remote.plain_http,
                    offline=remote.offline, cache_dir=remote.cache_dir,
                    timeout=TRANSFER_TIMEOUT_S if remote.timeout is None else remote.timeout)
    if pulled.reference is None:
        if remote.allow_downgrade:
            raise UsageError(f"--allow-downgrade applies to a bundle reference by tag or URL; {text} is a file: "
                             "leave it out")
        if remote.timeout is not None:
            raise UsageError(f"--transfer-timeout applies to a bundle reference (oci://REGISTRY/REPO:TAG or an "
                             f"https:// URL); {text} is a file: leave it out")
        return Target(pulled.path, True)
    from heddle.cli import output
    from heddle.cli.errors import alias

    alias(str(pulled.path), pulled.reference)
    key = None
    if remote.seen:
        from heddle.oci.seen import check_seen, seen_key

        accepted = check_seen(pulled, allow_downgrade=remote.allow_downgrade, cache_dir=remote.cache_dir,
                              record=False)
        if accepted is not None:
            output.warn(accepted)
        key = seen_key(pulled)
    what = f" ({pulled.oci_digest})" if pulled.oci_digest else ""
    if pulled.downloaded:
        output.note(f"pulled {pulled.reference}{what}")
    output.detail(f"{pulled.reference}{what}: {'downloaded to' if pulled.downloaded else 'in the cache at'} "
                  f"{pulled.path}")
    return Target(pulled.path, True, pulled.reference, pulled.oci_digest, key)


def _one_of(positional: str | Path | None, flow: Path | None, what: str) -> str | Path | None:
    """The path given, or None when it was given with --flow; refuses none and both."""
    if positional is not None and flow is not None:
        raise UsageError(f"give the {what} either as the argument or with --flow PATH, not both "
                         f"({positional} and --flow {flow})")
    if positional is None and flow is None:
        raise UsageError(f"missing the {what}: give a .heddle bundle or a flow document (.json, .yaml, .yml), "
                         "or --flow PATH")
    return positional


def _reference_hint(given: str | Path) -> str:
    """For REGISTRY/REPO:TAG written without its scheme: how to write it as a reference."""
    import re

    text = str(given)
    if isinstance(given, str) and re.fullmatch(r"[\w.-]+[.:][\w.:-]*/[\w./-]+(:[\w.-]+|@sha256:[0-9a-f]{64})", text):
        return f", or write oci://{text} to pull it from a registry"
    return ""


def _kind(path: Path) -> str | None:
    """What is at `path` if it is not a regular file ("a directory", "a FIFO", ...), else None."""
    from heddle.safeparse import file_kind

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


def resolve_target(positional: str | Path | None, flow: Path | None, *, bundle_options: Sequence[str] = (),
                   remote: Remote = Remote()) -> Target:
    """What `heddle run` / `heddle validate` are given: a bundle (a path or a reference), or a flow
    document.

    `bundle_options` names the options given that only a bundle takes.
    """
    from heddle.format.errors import MalformedBundleError
    from heddle.safeparse import NotRegularFileError

    given = _one_of(positional, flow, "flow or bundle")
    # Every reference is written with a scheme (oci://, https://, http://): a path without "://"
    # runs without loading heddle.oci.
    if isinstance(given, str) and "://" in given:
        from heddle.oci.reference import looks_like_reference

        if looks_like_reference(given):
            return bundle_target(given, remote)
    if remote.plain_http or remote.offline or remote.allow_downgrade or remote.timeout is not None:
        bundle_target(given if given is not None else Path(str(flow)), remote)  # refuses them, naming the path
    if given is None:
        assert flow is not None
        if bundle_options:
            raise UsageError(f"{', '.join(bundle_options)} apply to bundles; --flow {flow} reads a flow document: "
                             "leave them out, or give the bundle's path instead of --flow")
        return Target(flow, False)
    path = Path(given)
    suffix = path.suffix.lower()
    must_be_bundle = suffix == BUNDLE_SUFFIX or bool(bundle_options)
    from heddle.format.frame import starts_like_bundle

    try:
        if starts_like_bundle(path):
            return Target(path, True)
    except NotRegularFileError as exc:
        if must_be_bundle:
            raise MalformedBundleError(f"{path}: not a heddle bundle (it is {exc.kind})") from None
        if suffix in FLOW_SUFFIXES:
            return Target(path, False)  # load_flow names what it is
        raise UsageError(f"{path}: is {exc.kind}, not a bundle or a flow document") from None
    except FileNotFoundError:
        if must_be_bundle or suffix not in FLOW_SUFFIXES:
            raise UsageError(f"{path}: no such file; give the path of a .heddle bundle or a flow document"
                             f"{_reference_hint(given)}") from None
        return Target(path, False)  # load_flow says so, as it always has
    except OSError as exc:
        if must_be_bundle or suffix not in FLOW_SUFFIXES:
            raise UsageError(f"{path}: cannot be read: {exc.strerror}") from None
        return Target(path, False)
    if must_be_bundle:
        if bundle_options:
            why = f"{BUNDLE_OPTIONS} apply to bundles only: leave them out to run a flow document"
        else:
            why = (f"a path ending in {BUNDLE_SUFFIX} must be one: to run a flow document, name it .json, .yaml "
                   "or .yml, or pass --flow PATH")
        raise MalformedBundleError(f"{path}: not a heddle bundle (it does not start with a bundle's magic "
                                   f"number; {why})")
    if suffix in FLOW_SUFFIXES:
        return Target(path, False)
    raise UsageError(f"{path}: is not a heddle bundle, and its name does not make it a flow document; {_BOTH_WAYS}")


def resolve_flow(positional: Path | None, flow: Path | None) -> Path:
    """The flow `heddle bundle` seals: a flow document by the same rule, never a bundle."""
    from heddle.safeparse import NotRegularFileError

    given = _one_of(positional, flow, "flow")
    if given is None:
        assert flow is not None
        return flow
    path = Path(given)
    suffix = path.suffix.lower()
    from heddle.format.frame import starts_like_bundle

    try:
        bundle = starts_like_bundle(path)
    except (NotRegularFileError, OSError):
        bundle = False  # load_flow names what is wrong with the path
    if bundle or suffix == BUNDLE_SUFFIX:
        raise UsageError(f"{path}: is {'a heddle bundle' if bundle else 'named like a heddle bundle'}; "
                         "heddle bundle seals a flow document (.json, .yaml, .yml, or any file with --flow PATH)")
    if suffix in FLOW_SUFFIXES:
        return path
    kind = _kind(path)
    if kind is not None:
        raise UsageError(f"{path}: is {kind}, not a flow document")
    raise UsageError(f"{path}: its name does not make it a flow document; name it .json, .yaml or .yml, "
                     "or pass --flow PATH to read it as one")
