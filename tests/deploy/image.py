"""What the deployment files say, read as the tests need it: the Containerfile's ENTRYPOINT, USER and
ENV, and the Kubernetes manifests as kustomize renders them, with the heddle-server container of the
Deployment."""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "Containerfile"
MANIFESTS = REPO / "deploy" / "kubernetes"

Doc = dict[str, Any]


@dataclass(frozen=True)
class Image:
    entrypoint: list[str]
    user: str
    env: dict[str, str]


def read_image(path: Path = CONTAINERFILE) -> Image:
    """The final stage's ENTRYPOINT (exec form), USER and ENV."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    final = max(i for i, line in enumerate(lines) if line.upper().startswith("FROM "))
    entrypoint: list[str] | None = None
    user, env = "", {}
    for line in lines[final:]:
        word, _, rest = line.partition(" ")
        if word.upper() == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif word.upper() == "USER":
            user = rest.strip()
        elif word.upper() == "ENV":
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                env[name] = value
    assert entrypoint is not None, f"{path}: no ENTRYPOINT in exec form"
    return Image(entrypoint, user, env)


# What a user applies: the stateless base, sessions on Postgres, and both with autoscaling and scraping.
ROOTS = ("", "overlays/postgres", "overlays/production")


def kubectl() -> str:
    """kubectl, whose `kubectl kustomize` renders what `kubectl apply -k` applies; a skip naming it if missing."""
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl is not installed (for `kubectl kustomize`); see https://kubernetes.io/docs/tasks/tools/")
    return found


def render(root: Path) -> list[Doc]:
    """The documents `kubectl apply -k root` would apply."""
    done = subprocess.run([kubectl(), "kustomize", str(root)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"kubectl kustomize {root}: {done.stderr.strip()}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


@functools.cache
def _rendered(root: str) -> tuple[Doc, ...]:
    return tuple(render(MANIFESTS / root))


def manifests() -> Iterator[tuple[str, Doc]]:
    """Every document of every rendering, with the kustomization it came from (relative to deploy/kubernetes)."""
    for root in ROOTS:
        for doc in _rendered(root):
            yield root or ".", doc


def of_kind(kind: str, root: str | None = None) -> list[Doc]:
    """The documents of `kind` in one rendering, or in all of them."""
    return [doc for where, doc in manifests()
            if doc.get("kind") == kind and (root is None or where == (root or "."))]


def server_container(deployment: Doc) -> Doc:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "heddle-server"]
    return dict(container)


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(NAME)` as the kubelet expands it in args from the container's environment."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)
