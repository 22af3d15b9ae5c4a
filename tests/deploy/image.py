"""What the deployment files say, read as the tests need it: the Containerfile's ENTRYPOINT, USER and
ENV, and the Kubernetes manifests with the heddle-server container of the Deployment."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def manifests() -> Iterator[tuple[Path, Doc]]:
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                yield path, doc


def of_kind(kind: str) -> list[Doc]:
    return [doc for _, doc in manifests() if doc.get("kind") == kind]


def server_container(deployment: Doc) -> Doc:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == "heddle-server"]
    return dict(container)


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(NAME)` as the kubelet expands it in args from the container's environment."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)
