"""`heddle keygen`, `sign`, `verify`, `inspect`, `trust`, `cache`, `diff` and `doctor`: thin shells over
heddle.bundle. Only typer and the standard library are imported at the top; the library
(and cryptography, zstandard) load when a command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from heddle.cli import output
from heddle.cli.flags import takes
from heddle.cli.output import QUIET, VERBOSE, json_option
from heddle.textsafe import printable

if TYPE_CHECKING:
    from collections.abc import Mapping

    from heddle.bundle.seal import SealResult
    from heddle.format.manifest import Manifest
    from heddle.format.verify import ToolFingerprints

_TRUST = typer.Option(
    [], "--trust", metavar="KEY.pub|KEYID",
    help="Trust only this key for this command: a .pub file or a key id in the trust store (repeatable). "
    "Without it, every key in the trust store is trusted.",
)
_ALLOW_UNSIGNED = typer.Option(
    False, "--allow-unsigned",
    help="Admit a bundle that carries no signature at all (never one with a bad or untrusted one).",
)
_CACHE_DIR = typer.Option(
    None, "--cache-dir",
    help="Where verified payloads (and pulled bundles) are kept [default: $HEDDLE_CACHE_DIR or "
         "~/.cache/heddle/bundles].",
)
_REFERENCE = ("a .heddle path, or a reference: oci://REGISTRY/REPO:TAG, oci://REGISTRY/REPO@sha256:DIGEST, an "
              "https:// URL")


def _target(text: str, plain_http: bool, offline: bool, cache_dir: Path | None = None) -> Any:
    """The bundle a command was given: a path, or a reference pulled into the cache."""
    from heddle.cli.target import Remote, bundle_target

    return bundle_target(text, Remote(plain_http, offline, cache_dir))


_size = output.binary_size


def _trusting(names: list[str], keyids: list[str]) -> str:
    """Which keys a command trusted, and why, for --verbose."""
    from heddle.format.trust import TrustStore

    where = "named by --trust" if names else f"in the trust store {TrustStore().directory}"
    return f"trusting {len(keyids)} key(s) {where}: {', '.join(keyids) or 'none'}"


def seal_result_json(result: SealResult) -> dict[str, Any]:
    """`heddle bundle --json`: what was written, as one object."""
    m = result.manifest
    return {
        "bundle": str(result.path), "digest": result.digest, "name": result.name, "signers": list(result.signers),
        "size": result.size, "payload_bytes": result.payload_size, "files": result.file_count,
        "tools": sorted(m.tools), "mounts": [mount.dest for mount in m.mounts],
        "plugins": [plugin.name for plugin in m.plugins], "skipped": [str(path) for path in result.skipped],
    }


def print_seal_result(result: SealResult, *, json_out: bool = False) -> None:
    """What `heddle bundle` reports once a bundle is written: digest, signer, sizes, counts, skipped."""
    for path in result.skipped:
        output.note(f"left out {path} (version-control folders are never sealed)")
    if json_out:
        output.print_json(seal_result_json(result))
        return
    m = result.manifest
    signed = f"by {', '.join(result.signers)}" if result.signers else "no (unsigned: runs only with --allow-unsigned)"
    typer.echo(f"sealed {result.path}")
    typer.echo(f"  digest   {result.digest}")
    typer.echo(f"  signed   {signed}")
    typer.echo(f"  size     {_size(result.size)} compressed, {_size(result.payload_size)} of payload")
    typer.echo(f"  contents {result.file_count} files, {len(m.tools)} tools, {len(m.mounts)} mounts, "
               f"{len(m.plugins)} plugins")


def keygen(
    out: Path = typer.Option(..., "--out", metavar="PATH", help="Write PATH.key (private, 0600) and PATH.pub."),
    no_passphrase: bool = typer.Option(
        False, "--no-passphrase", help="Leave the private key unencrypted (for CI keys kept in a secret store)."
    ),
    json_out: bool = json_option("Print the key id and the paths of the two files as JSON."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Make an Ed25519 signing key pair and print its key id.

    The private key is PKCS#8 PEM, encrypted with a passphrase from HEDDLE_KEY_PASSPHRASE or
    asked for on the terminal. Nothing is trusted by this: use `heddle trust add PATH.pub`
    where bundles are verified, or `--trust PATH.pub` for one command.
    """
    from heddle.format.keys import generate, key_paths, passphrase_from_env_or_prompt

    output.use(quiet=quiet, verbose=verbose)
    passphrase = None
    if not no_passphrase:
        for path in key_paths(out):
            if path.exists():
                break
        else:
            passphrase = passphrase_from_env_or_prompt(
                "Passphrase for the new key: ", confirm=True, missing_hint="pass --no-passphrase"
            )
    made = generate(out, passphrase)
    if json_out:
        output.print_json({"keyid": made.keyid, "private_key": str(made.private_path),
                           "public_key": str(made.public_path), "encrypted": passphrase is not None})
    else:
        typer.echo(made.keyid)
    output.detail(f"Ed25519 key {made.keyid}; the private key is "
                  f"{'encrypted with the passphrase' if passphrase is not None else 'not encrypted (--no-passphrase)'}")
    output.note(f"wrote {made.private_path} (private: keep it secret) and {made.public_path}")
    output.note(f"to trust it: heddle trust add {made.public_path}")


def sign(
    bundle: Path = typer.Argument(..., metavar="BUNDLE", help="The .heddle file to sign (rewritten in place)."),
    key: Path = typer.Option(..., "--key", metavar="KEY", help="Private key from `heddle keygen` (PATH.key)."),
    json_out: bool = json_option("Print the digest and the signatures now on the bundle as JSON."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Add a signature to a bundle. The manifest, and so the digest, stay exactly the same."""
    from heddle.format.keys import load_signing_key
    from heddle.format.pack import add_signature

    output.use(quiet=quiet, verbose=verbose)
    signing_key = load_signing_key(key)
    output.detail(f"signing with key {signing_key.keyid} from {key}")
    digest, signatures = add_signature(bundle, signing_key)
    if json_out:
        output.print_json({"bundle": str(bundle), "keyid": signing_key.keyid, "digest": f"sha256:{digest}",
                           "signatures": signatures.keyids})
        return
    typer.echo(f"signed {bundle} with key {signing_key.keyid}")
    typer.echo(f"  digest     sha256:{digest} (unchanged)")
    typer.echo(f"  signatures {', '.join(signatures.keyids)}")


def _fingerprints_imported_meanwhile() -> ToolFingerprints:
    """`flow_tool_fingerprints`, its module imported on a thread while the bundle is proved and its
    payload unpacked (the fingerprints are checked after): the document models are half of the
    command's fixed cost, and the payload's hashing, decompressing and writing mostly run outside
    the interpreter lock. The modules that import brings and those the verifier imports on its way
    (zstandard, cryptography) are disjoint, so no module is ever imported by both threads at once.

    Not a daemon: a refusal can end the command while the thread is still inside an extension
    module's import, and an interpreter finalized under it crashed (SIGSEGV after the error line);
    shutdown waits for a thread that is not a daemon."""
    import contextlib
    import threading

    def load() -> None:
        with contextlib.suppress(BaseException):  # imported again below, where its error is raised
            import heddle.bundle.fingerprints  # noqa: F401

    thread = threading.Thread(target=load, name="heddle-import")
    thread.start()

    def fingerprints(flow: Path, manifest: Manifest) -> Mapping[str, str]:
        thread.join()
        from heddle.bundle.fingerprints import flow_tool_fingerprints

        return flow_tool_fingerprints(flow, manifest)

    return fingerprints


@takes("plain_http", "offline")
def verify(
    bundle: str = typer.Argument(..., metavar="BUNDLE", help=f"The bundle to verify: {_REFERENCE}."),
    trust: list[str] = _TRUST,
    allow_unsigned: bool = _ALLOW_UNSIGNED,
    json_out: bool = typer.Option(False, "--json", help="Print the outcome as one JSON object on stdout."),
    deep: bool = typer.Option(False, "--deep", help="Also re-hash every file of a payload already in the cache."),
    cache_dir: Path | None = _CACHE_DIR,
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    plain_http: bool,
    offline: bool,
) -> None:
    """Prove a bundle is exactly what a trusted key sealed, and unpack it into the cache.

    The file's own payload is always read and checked, cached or not; a cached copy is
    re-proved too, and replaced if it was changed. A reference is pulled first (checked
    against its OCI digest as it streams), then verified the same way.

    Exit codes: 0 verified; 3 unsigned; 4 signed by no trusted key; 5 a bad signature from a
    trusted key; 6 content does not match the manifest (or a pulled blob its digest); 7
    malformed or over a cap; 8 made by a newer heddle; 2 usage, or a registry that cannot be
    reached, refuses the credentials or has no such reference.
    """
    from heddle.cli.errors import error_context
    from heddle.cli.progress import terminal_progress
    from heddle.format.cache import digest_text
    from heddle.format.trust import TrustPolicy
    from heddle.format.verify import verify_bundle

    tool_fingerprints = _fingerprints_imported_meanwhile()
    output.use(quiet=quiet, verbose=verbose)
    policy = TrustPolicy.from_names(trust, allow_unsigned=allow_unsigned)
    output.detail(_trusting(trust, policy.keyids) + ("; admitting an unsigned bundle" if allow_unsigned else ""))
    # A pulled blob that is not what its digest says is a verification outcome like any other.
    error_context(bundle=bundle, oci_digest=None)
    target = _target(bundle, plain_http, offline, cache_dir)
    error_context(bundle=target.name, oci_digest=target.oci_digest)
    opened = verify_bundle(
        target.path, trusted_keys=policy.trusted, allow_unsigned=policy.admits_unsigned, cache_root=cache_dir,
        deep=deep, prove_file=True,
        progress=None if json_out else terminal_progress(), tool_fingerprints=tool_fingerprints,
    )
    m = opened.manifest
    if opened.repaired:
        output.warn(f"the cached copy could not be proved ({opened.repaired}); it was replaced")
    output.detail(f"payload {'already in the cache, proved again' if opened.cached else 'checked and unpacked'}"
                  f"{' and re-hashed (--deep)' if opened.cached and deep else ''}: {opened.root}")
    if json_out:
        typer.echo(json.dumps({
            "ok": True, "bundle": target.name, "oci_digest": target.oci_digest,
            "digest": digest_text(opened.digest),
            "signers": opened.signers, "signed_at": opened.signed_at, "release": m.release,
            "legacy": opened.legacy, "cached": opened.cached, "repaired": opened.repaired,
            "root": str(opened.root), "name": m.name,
            "files": len(m.files), "payload_bytes": m.total_size, "tools": sorted(m.tools),
            "commands": sorted(m.commands.entries) if m.commands is not None else [],
        }, ensure_ascii=False))
        return
    typer.echo(f"verified {target.name}")
    typer.echo(f"  digest   {'sha256:' + opened.digest if not opened.legacy else opened.digest}")
    if target.oci_digest:
        typer.echo(f"  oci      {target.oci_digest}")
    if opened.signers:
        at = f", at {opened.signed_at}" if opened.signed_at is not None else ", at an unknown time"
        typer.echo(f"  signed   by {', '.join(opened.signers)} (trusted){at}")
    if m.release is not None:
        typer.echo(f"  release  {m.release}")
    else:
        typer.echo("  signed   no (admitted by --allow-unsigned)")
    typer.echo(f"  contents {len(m.files)} files ({_size(m.total_size)}), {len(m.tools)} tools, {len(m.mounts)} mounts")
    note = "" if not opened.cached else " (already verified, re-hashed)" if deep else " (already verified)"
    typer.echo(f"  cache    {opened.root}{note}")


@takes("plain_http", "offline")
def inspect(
    bundle: str = typer.Argument(..., metavar="BUNDLE", help=f"The bundle to describe: {_REFERENCE}."),
    trust: list[str] = _TRUST,
    json_out: bool = typer.Option(False, "--json", help="Print the manifest, signatures and status as JSON "
                                                        "(oci_digest: the OCI manifest digest of a reference)."),
    cache_dir: Path | None = _CACHE_DIR,
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    plain_http: bool,
    offline: bool,
) -> None:
    """Show a bundle's manifest, files and tools with their input-schema fingerprints, without unpacking it.

    The listing is marked UNVERIFIED unless a trusted key signed it and its payload was verified.
    """
    from heddle.format.trust import TrustPolicy
    from heddle.format.verdict import trust_verdict
    from heddle.format.verify import peek

    output.use(quiet=quiet, verbose=verbose)
    if output.verbosity() is output.Verbosity.VERBOSE:
        output.detail(_trusting(trust, TrustPolicy.from_names(trust).keyids))
    target = _target(bundle, plain_http, offline, cache_dir)
    seen = peek(target.path)
    verdict = trust_verdict(target.path, seen, TrustPolicy.from_names(trust), cache_dir=cache_dir)
    status = str(verdict)
    if json_out:
        typer.echo(json.dumps({
            "bundle": target.name, "oci_digest": target.oci_digest, "status": verdict.status, "detail": status,
            "digest": f"sha256:{seen.digest}" if seen.digest else None, "signatures": seen.signatures.keyids,
            "manifest": seen.manifest.to_json(),
        }, ensure_ascii=False, indent=2))
        return
    _print_manifest(target.name, seen.manifest, seen.digest or "", seen.signatures.keyids, status, target.oci_digest)


def _print_manifest(bundle: str, m: Manifest, digest: str, keyids: list[str], status: str,
                    oci_digest: str | None = None) -> None:
    echo = typer.echo
    echo(f"{bundle}: {status}")
    if oci_digest:
        echo(f"  oci        {oci_digest}")
    echo(f"  name       {m.name}")
    if digest:
        echo(f"  digest     sha256:{digest}")
        echo(f"  format     heddle-bundle {m.version}, packed by heddle {m.heddle_version}")
    else:
        echo(f"  format     legacy gzip bundle ({m.heddle_version})")
    echo(f"  signatures {', '.join(keyids) if keyids else 'none'}")
    echo(f"  flow       {m.flow}")
    if m.components is not None:
        echo(f"  components {m.components}")
    echo(f"  tools      {len(m.tools)}")
    for name, tool in sorted(m.tools.items()):
        echo(f"    {name:<20} {tool.entry:<30} {tool.fingerprint}")
    if m.commands is not None:
        echo(f"  commands   {len(m.commands.entries)} ({m.commands.file})")
        for name, command in sorted(m.commands.entries.items()):
            echo(f"    {name:<20} revision {command.revision}")
            echo(f"    {'':<20} input-schema fingerprint {command.fingerprint}")
            first, *more = command.expected_version.splitlines()
            shown = json.dumps(first, ensure_ascii=False) + (f" (and {len(more)} more lines)" if more else "")
            echo(f"    {'':<20} expected version {shown}")
            echo(f"    {'':<20} adapter_version {json.dumps(command.adapter_version, ensure_ascii=False)}")
            if command.executable_path is not None:
                echo(f"    {'':<20} program {command.executable_path} sha256 {command.executable_sha256}")
    if m.egress is None:
        echo("  egress     not declared (tools and remote calls may reach any host)")
    else:
        echo(f"  egress     {len(m.egress)} allow-lists")
        for name, hosts in sorted(m.egress.items()):
            echo(f"    {printable(name):<20} {', '.join(hosts)}")
    for name, secret in sorted((m.secrets or {}).items()):
        source = f"${secret['env']}" if "env" in secret else secret["file"]
        placed = f"the query parameter {secret['query']!r}" if "query" in secret else repr(secret["header"])
        echo(f"  secret     {name} from {printable(source)}, sent as {printable(placed)} to "
             f"{', '.join(secret['hosts'])}")
    echo(f"  mounts     {len(m.mounts)}")
    for mount in m.mounts:
        echo(f"    {mount.dest} <- {mount.prefix} ({mount.mode})")
    echo(f"  plugins    {len(m.plugins)}")
    for plugin in m.plugins:
        echo(f"    {plugin.name} ({plugin.manifest})")
    echo(f"  input      {json.dumps(dict(m.input), ensure_ascii=False)}")
    if m.requires:
        echo(f"  requires   bins {list(m.requires.bins)}, env {list(m.requires.env)}, files {list(m.requires.files)}")
    if m.proposals.max_tool_rounds is not None:
        echo(f"  proposes   max_tool_rounds {m.proposals.max_tool_rounds}")
    echo(f"  files      {len(m.files)} ({_size(m.total_size)})")
    for item in m.files:
        echo(f"    {item.mode:04o} {item.size:>10} {item.sha256[:16]} {item.path}")


@takes("plain_http", "offline")
def diff(
    a: str = typer.Argument(..., metavar="A", help="The older bundle: a .heddle path or a reference."),
    b: str = typer.Argument(..., metavar="B", help="The newer bundle: a .heddle path or a reference."),
    json_out: bool = typer.Option(False, "--json", help="Print the differences as JSON."),
    exit_code: bool = typer.Option(False, "--exit-code", help="Exit 1 when the bundles differ, 0 when they do not "
                                                              "(as git diff --exit-code)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    plain_http: bool,
    offline: bool,
) -> None:
    """Show the files, tools, input-schema fingerprints and settings that differ from A to B.

    Reads both manifests without verifying either; exits 0 whether or not they differ, unless
    --exit-code is given: then 1 when they differ.
    """
    from heddle.bundle.diff import diff_manifests
    from heddle.format.verify import peek

    output.use(quiet=quiet, verbose=verbose)
    first, second = _target(a, plain_http, offline), _target(b, plain_http, offline)
    older, newer = peek(first.path), peek(second.path)
    for label, target, seen in (("A", first, older), ("B", second, newer)):
        digest = f"sha256:{seen.digest}" if seen.digest else "a legacy bundle"
        output.detail(f"{label} {target.name}: {digest}, {len(seen.manifest.files)} files (not verified)")
    changes = diff_manifests(older.manifest, newer.manifest)
    if json_out:
        typer.echo(json.dumps(changes.to_json(), ensure_ascii=False, indent=2))
    elif not changes:
        typer.echo("no differences")
    for line in [] if json_out else changes.lines():
        typer.echo(line)
    if exit_code and changes:
        raise typer.Exit(1)


@takes("plain_http", "offline")
def doctor(
    bundle: str = typer.Argument(..., metavar="BUNDLE", help=f"The bundle whose requirements to check: {_REFERENCE}."),
    trust: list[str] = _TRUST,
    allow_unsigned: bool = _ALLOW_UNSIGNED,
    json_out: bool = json_option("Print every check as JSON (the exit status is the same)."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
    *,
    plain_http: bool,
    offline: bool,
) -> None:
    """Check that this machine has what the bundle needs: what it `requires` and what its flow reads
    (binaries on PATH, environment variables set, the `$VAR`s of its llm configs too, values never
    printed; files present); each command's program at its sealed path with its sealed sha256, and
    answering its version probe with the expected version; each plugin's runtime (the program its
    manifest's command starts); and bubblewrap, when the bundle proposes --safe. Installs nothing:
    it reads the manifest and the sealed files it needs from the archive. Beside them it reports which
    layers of a tool's isolation this machine enforces (sandbox, netns, proxy, seccomp, rlimits), as
    --require-isolation checks them. A version probe runs a
    program with arguments the bundle chose, so only for a bundle whose signers are trusted (as
    --trust and --allow-unsigned say, as for run); otherwise it is listed as not run.

    Exits 0 when everything is there, 9 when something is missing (the bundle would not run here).
    """
    from heddle.bundle.flowenv import sealed_flow_reads
    from heddle.bundle.machine import check_machine, trust_problem
    from heddle.bundle.requires import check_flow_env, check_requires
    from heddle.format.errors import RequirementsUnmetError
    from heddle.format.verify import peek

    output.use(quiet=quiet, verbose=verbose)
    target = _target(bundle, plain_http, offline)
    name = target.name
    seen = peek(target.path)
    checks = check_requires(seen.manifest.requires)
    output.detail(f"{name} declares {len(checks)} requirement(s)")
    if seen.legacy:
        output.note(f"{name}: a format-1 bundle; only its declared requirements are checked, "
                    "not its flow's variables")
    else:
        reads = check_flow_env(sealed_flow_reads(target.path), declared=seen.manifest.requires.env)
        output.detail(f"its sealed flow reads {len(reads)} more environment variable(s)")
        checks += reads
        m = seen.manifest
        if m.commands is not None or m.plugins or m.proposals.safe:
            why_not = trust_problem(seen.manifest_bytes, seen.signatures, trust=trust, allow_unsigned=allow_unsigned,
                                    what=name) if m.commands is not None else None
            checks += check_machine(target.path, m, probe=why_not is None, why_not=why_not or "")
    from heddle.bundle.machine import check_tracing

    tracing = check_tracing()  # not the bundle's requirement: whether its runs here would be traced
    from heddle.workspace.sandbox import isolation_layers

    isolation = isolation_layers()  # not a requirement either: which layers this machine enforces
    missing = [c for c in (*checks, tracing) if not c.ok and c.required]
    if json_out:
        pulled = {"oci_digest": target.oci_digest} if target.reference else {}
        output.print_json({
            "bundle": name, **pulled, "ok": not missing,
            "checks": [{"kind": c.kind, "name": c.name, "required": c.required, "ok": c.ok, "detail": c.detail}
                       for c in checks],
            "tracing": {"ok": tracing.ok, "detail": tracing.detail},
            "isolation": [{"layer": layer, "enforced": ok, "detail": why} for layer, ok, why in isolation],
        })
    elif not checks:
        typer.echo(f"{name} requires nothing of this machine")
    for check in [] if json_out else checks:
        status = "ok     " if check.ok else "MISSING" if check.required else "unset  " if check.kind == "env" \
            else "not run"
        # A detail may quote what a program printed (its version).
        typer.echo(printable(f"{status} {check.kind:<4} {check.name}: {check.detail}"))
    if not json_out:
        typer.echo(printable(f"{'ok     ' if tracing.ok else 'MISSING'} {tracing.kind:<4} {tracing.name}: "
                             f"{tracing.detail}"))
        for layer, ok, why in isolation:
            typer.echo(printable(f"{'ok     ' if ok else 'absent '} iso  {layer}: {why}"))
    if missing:
        names = ", ".join(f"{c.kind} {c.name}" for c in missing)
        needed = sum(c.required for c in checks) + (not tracing.ok)
        raise RequirementsUnmetError(f"{name}: {len(missing)} of {needed} requirements missing: {names}")


trust_app = typer.Typer(
    name="trust",
    help="The keys this user trusts to sign bundles ($HEDDLE_TRUST_DIR or ~/.config/heddle/trust).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@trust_app.command("add")
def trust_add(
    key: Path = typer.Argument(..., metavar="KEY.pub", help="A public key from `heddle keygen`."),
    json_out: bool = json_option("Print the key id, whether it was new, and where it is kept as JSON."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Trust a public key for verifying bundles."""
    from heddle.format.trust import TrustStore

    output.use(quiet=quiet, verbose=verbose)
    store = TrustStore()
    added, new = store.add(key)
    output.detail(f"trust store: {store.directory}")
    if json_out:
        output.print_json({"keyid": added.keyid, "added": new, "key": str(key), "path": str(store.directory /
                                                                                           f"{added.keyid}.pub")})
        return
    typer.echo(f"{'trusted' if new else 'already trusted'} {added.keyid} ({key})")


def trust_ls(
    json_out: bool = json_option("Print the keys as a JSON array."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """List the trusted keys: key id and file."""
    from heddle.format.trust import TrustStore

    output.use(quiet=quiet, verbose=verbose)
    store = TrustStore()
    output.detail(f"trust store: {store.directory}")
    keys = store.list()
    if json_out:
        output.print_json([{"keyid": key.keyid, "path": key.source} for key in keys])
        return
    if not keys:
        output.note(f"no trusted keys in {store.directory}; add one with `heddle trust add KEY.pub`")
    for key in keys:
        typer.echo(f"{key.keyid}  {key.source}")


trust_app.command("ls")(trust_ls)
# The name this command had first; kept working, not listed.
trust_app.command("list", hidden=True)(trust_ls)


@trust_app.command("remove")
def trust_remove(
    keyid: str = typer.Argument(..., metavar="KEYID", help="The key id (or a unique prefix of 8+ digits)."),
    json_out: bool = json_option("Print the key id removed as JSON."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Stop trusting a key."""
    from heddle.format.trust import TrustStore

    output.use(quiet=quiet, verbose=verbose)
    store = TrustStore()
    output.detail(f"trust store: {store.directory}")
    removed = store.remove(keyid)
    if json_out:
        output.print_json({"removed": removed.keyid, "path": removed.source})
        return
    typer.echo(f"removed {removed.keyid}")


cache_app = typer.Typer(
    name="cache",
    help="""The cache of verified payloads ($HEDDLE_CACHE_DIR or ~/.cache/heddle/bundles).

    Each bundle verified once is kept under its digest, read-only, so later runs skip
    unpacking it; every open still re-checks its signatures, re-hashes its programs and
    manifests, and checks every other file against the stat snapshot taken when it was
    stored. Bundles pulled from a registry or a URL are kept beside them (pulled/), by
    their OCI digest, and verified like any file at each use. Nothing is removed on its own:

      heddle cache ls                       # digest, name, size, last used
      heddle cache prune                    # entries unused for 30 days
      heddle cache prune --older-than 12h   # units: d, h, m, s (e.g. 1d12h)
      heddle cache prune --all              # everything
    """,
    no_args_is_help=True,
    rich_markup_mode=None,
)

_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str, *, flag: str = "--older-than") -> float:
    """Seconds in a duration such as `30d`, `12h`, `90m`, `45s` or `1d12h`."""
    import re

    match = re.fullmatch(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text.strip())
    if not text.strip() or match is None:
        from heddle.errors import UsageError

        raise UsageError(f"{flag} {text!r} is not a duration; write a whole number and a unit, "
                         "such as 30d, 12h, 90m or 45s")
    return float(sum(int(n) * _DURATION_UNITS[u] for n, u in zip(match.groups(), "dhms", strict=True) if n))


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return "just now"


@cache_app.command("ls")
def cache_ls(
    json_out: bool = typer.Option(False, "--json", help="Print the entries as a JSON array."),
    cache_dir: Path | None = _CACHE_DIR,
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """List the cached payloads (digest, name, size, when each was last used), then the pulled
    bundles (OCI digest, or a URL's file digest, the reference it was pulled as, size, last use).

    An entry whose snapshot does not hold is marked; it would not be trusted (an open
    verifies it again) and `heddle cache prune` removes it.
    """
    import time
    from datetime import UTC, datetime

    from heddle.format.cache import Cache
    from heddle.oci.store import PulledStore

    output.use(quiet=quiet, verbose=verbose)
    cache = Cache(cache_dir)
    output.detail(f"cache: {cache.root}")
    entries = cache.entries()
    pulled = PulledStore(cache_dir).entries()

    def stamp(when: float) -> str:
        return datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds")

    if json_out:
        typer.echo(json.dumps([*({
            "kind": "payload", "digest": e.digest, "name": e.name or None,
            "size": e.size, "files": e.files, "legacy": e.legacy, "path": str(e.path), "last_used": stamp(e.last_used),
            "ok": e.problem is None, "problem": e.problem,
        } for e in entries), *({
            "kind": "pulled", "digest": p.digest, "source": p.kind, "reference": p.reference, "size": p.size,
            "path": str(p.path), "last_used": stamp(p.last_used), "ok": p.problem is None, "problem": p.problem,
        } for p in pulled)], ensure_ascii=False, indent=2))
        return
    if not entries and not pulled:
        output.note(f"the cache at {cache.root} is empty")
        return
    now = time.time()
    if entries:
        typer.echo(f"{'DIGEST':<71}  {'NAME':<20}  {'SIZE':>10}  LAST USED")
    for e in entries:
        digest = e.digest
        used = datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M")
        name = e.name if e.problem is None else f"(not trusted: {e.problem})"
        typer.echo(f"{digest:<71}  {name:<20}  {_size(e.size):>10}  {used} ({_ago(max(0.0, now - e.last_used))})")
    if pulled:
        typer.echo(f"{'PULLED':<71}  {'SIZE':>10}  {'LAST USED':<29}  REFERENCE")
    for p in pulled:
        used = f"{datetime.fromtimestamp(p.last_used).strftime('%Y-%m-%d %H:%M')} " \
               f"({_ago(max(0.0, now - p.last_used))})"
        source = (p.reference or "(origin unknown)") if p.problem is None else f"(will be evicted: {p.problem})"
        typer.echo(f"{p.digest:<71}  {_size(p.size):>10}  {used:<29}  {source}")


@cache_app.command("prune")
def cache_prune(
    older_than: str | None = typer.Option(
        None, "--older-than", metavar="AGE",
        help="Remove entries not used for AGE: 30d, 12h, 90m, 45s [default: 30d].",
    ),
    all_: bool = typer.Option(False, "--all", help="Remove every entry."),
    cache_dir: Path | None = _CACHE_DIR,
    json_out: bool = json_option("Print what was removed and kept as JSON."),
    quiet: bool = QUIET,
    verbose: bool = VERBOSE,
) -> None:
    """Remove cached payloads and pulled bundles not used lately, entries that would not be
    trusted, and staging folders left by a killed verifier or pull (never one still running).

    An entry removed while a run uses it breaks that run: prune when nothing runs, or keep
    --older-than above the longest run.
    """
    from heddle.errors import UsageError
    from heddle.format.cache import Cache
    from heddle.oci.store import PulledStore

    output.use(quiet=quiet, verbose=verbose)
    if all_ and older_than is not None:
        raise UsageError("give --all or --older-than, not both")
    age = None if all_ else parse_duration(older_than if older_than is not None else "30d")
    cache = Cache(cache_dir)
    output.detail(f"cache: {cache.root}; removing entries "
                  f"{'of any age' if age is None else f'unused for {age:.0f} s or more'}")
    result = cache.prune(older_than=age)
    pulled, pulled_staging = PulledStore(cache_dir).prune(older_than=age)
    freed = sum(e.size for e in result.entries)
    for e in result.entries:
        output.note(f"removed {e.key if e.legacy else 'sha256:' + e.key} {e.name}".rstrip())
    for p in pulled:
        output.note(f"removed pulled {p.digest} {p.reference or ''}".rstrip())
    if json_out:
        output.print_json({
            "removed": [{"digest": e.digest, "name": e.name or None, "size": e.size,
                         "problem": e.problem} for e in result.entries],
            "freed_bytes": freed, "staging_removed": result.staging, "kept": result.kept,
            "pulled_removed": [{"digest": p.digest, "reference": p.reference, "size": p.size, "problem": p.problem}
                               for p in pulled],
            "pulled_freed_bytes": sum(p.size for p in pulled), "pulled_staging_removed": pulled_staging,
        })
        return
    typer.echo(f"removed {len(result.entries)} entries ({_size(freed)}) and {result.staging} staging folders; "
               f"kept {result.kept} entries")
    if pulled or pulled_staging:
        typer.echo(f"removed {len(pulled)} pulled bundles ({_size(sum(p.size for p in pulled))}) and "
                   f"{pulled_staging} pulled staging folders")

