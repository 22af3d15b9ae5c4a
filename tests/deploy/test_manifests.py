"""deploy/kubernetes/ and the Containerfile agree with the server they run: every manifest is valid
for its kind, every `heddle-server` flag the image and the Deployment pass is one `heddle-server
--help` lists (and reads, values and all), and ports, probe paths, the drain, volumes and the
autoscaling metric are the server's own. In-process but for one `heddle-server --help`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from heddle import secret_env
from heddle.format.cache import CACHE_DIR_ENV
from heddle.oci.auth import REGISTRY_ENV
from heddle.server.cli import config_from, parser
from heddle.server.config import check_config
from heddle.server.metrics import Metrics
from heddle.server.openapi import openapi_document
from heddle.server.serve import CANCEL_GRACE_S
from tests.deploy.image import MANIFESTS, Doc, expand, manifests, of_kind, read_image, server_container
from tests.server.support import SERVER

K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests are written for
# Kinds of operators the schemas do not carry; the test checks what heddle needs of them below.
CUSTOM = {"ScaledObject", "ServiceMonitor", "Kustomization"}


def _deployment() -> Doc:
    (deployment,) = of_kind("Deployment")
    return deployment


def _env(container: Doc) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def _argv(container: Doc) -> list[str]:
    """The image's entrypoint from heddle-server on, with the Deployment's args as the kubelet expands them."""
    entry = read_image().entrypoint
    literal = {name: e["value"] for name, e in _env(container).items() if "value" in e}
    literal["POD_NAMESPACE"] = "heddle"
    args = [expand(a, literal) for a in container.get("args", [])]
    assert "command" not in container, "the Deployment keeps the image's entrypoint (tini, then heddle-server)"
    return entry[entry.index("heddle-server") + 1:] + args


def _flag_value(argv: list[str], flag: str) -> str:
    values = [a.split("=", 1)[1] if "=" in a else argv[i + 1] for i, a in enumerate(argv)
              if a == flag or a.startswith(flag + "=")]
    assert len(values) == 1, f"{flag} given {len(values)} times"
    return values[0]


def test_every_manifest_is_valid_for_its_kind() -> None:
    seen = set()
    for path, doc in manifests():
        seen.add(doc["kind"])
        if doc["kind"] in CUSTOM:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{path.relative_to(MANIFESTS)}: {exc.message} at {list(exc.path)}") from None
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ScaledObject"} <= seen


def test_every_flag_passed_is_one_heddle_server_takes_and_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    help_text = subprocess.run([str(SERVER), "--help"], capture_output=True, text=True, check=True).stdout
    listed = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", help_text, flags=re.MULTILINE))
    container = server_container(_deployment())
    argv = _argv(container)
    passed = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    assert passed - listed == set(), f"flags heddle-server does not take: {sorted(passed - listed)}"
    # And they read as the server reads them: values, durations, and what --pull-interval needs.
    environ = {name: "x" for name, e in _env(container).items() if "valueFrom" in e}
    environ["HEDDLE_SESSION_STORE"] = "postgres://heddle@db/heddle"
    config = config_from(parser().parse_args(argv), environ)
    check_config(config)
    assert config.pull_interval is not None and str(config.bundle).startswith("oci://")
    assert config.settings.session_store == environ["HEDDLE_SESSION_STORE"]
    assert config.auth_token == "x", "the bearer token comes from the Secret through HEDDLE_AUTH_TOKEN"
    # Every variable of heddle's the pod sets is one heddle reads; the secret ones come from Secrets.
    known = {*secret_env.SECRET_ENV, REGISTRY_ENV, CACHE_DIR_ENV, "TMPDIR", "POD_NAMESPACE"}
    assert set(_env(container)) <= known, sorted(set(_env(container)) - known)
    for name in secret_env.SECRET_ENV & set(_env(container)):
        assert "secretKeyRef" in _env(container)[name].get("valueFrom", {}), f"{name} is not from a Secret"


def test_ports_probes_and_the_drain_are_the_servers() -> None:
    deployment = _deployment()
    pod = deployment["spec"]["template"]["spec"]
    container = server_container(deployment)
    argv = _argv(container)
    config = config_from(parser().parse_args(argv), {"HEDDLE_AUTH_TOKEN": "x"})
    (port,) = container["ports"]
    assert port["containerPort"] == config.port and config.host in ("0.0.0.0", "::")
    routes = set(openapi_document("0", auth=True)["paths"])
    probes = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    for kind, probe in probes.items():
        assert probe["path"] in routes, f"{kind} {probe['path']} is no route of the server"
        assert probe["port"] in (port["name"], port["containerPort"]), kind
    (service,) = of_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {port["name"], port["containerPort"]}
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    waits = float(pre_stop[-1]) if pre_stop[:1] == ["sleep"] else 0.0
    assert pod["terminationGracePeriodSeconds"] > waits + config.drain_timeout + CANCEL_GRACE_S
    (budget,) = of_kind("PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    for monitor in of_kind("ServiceMonitor"):
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics" and "/metrics" in routes
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["authorization"]["credentials"]["name"] == \
            _env(container)["HEDDLE_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"]


def pod_labels(deployment: Doc) -> dict[str, str]:
    return dict(deployment["spec"]["template"]["metadata"]["labels"])


def test_non_root_read_only_and_only_the_volumes_written() -> None:
    deployment = _deployment()
    pod = deployment["spec"]["template"]["spec"]
    container = server_container(deployment)
    image = read_image()
    security = {**pod.get("securityContext", {}), **container["securityContext"]}
    assert security["runAsNonRoot"] is True and str(security["runAsUser"]) == image.user.split(":")[0]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    argv = _argv(container)
    env = {**image.env, **{n: e["value"] for n, e in _env(container).items() if "value" in e}}

    def volume_of(path: str) -> Doc:
        owner = max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len)
        return dict(volumes[mounts[owner]["name"]])

    # The cache: a memory emptyDir (a sticky tmpfs, which heddle's private-folder rule accepts above
    # its cache), with the cache itself a folder heddle makes in it.
    cache = Path(env[CACHE_DIR_ENV])
    assert str(cache.parent) in mounts and volume_of(str(cache))["emptyDir"]["medium"] == "Memory"
    # The runs' folders: a folder heddle makes in a memory emptyDir too (a disk one is writable by
    # everyone, not sticky), which is the temporary folder of the tools.
    work = _flag_value(argv, "--work-dir")
    assert volume_of(work)["emptyDir"]["medium"] == "Memory" and env["TMPDIR"] == str(Path(work).parent)
    assert work not in mounts
    for trusted in [a.split("=", 1)[1] for a in argv if a.startswith("--trust=")]:
        volume = volume_of(trusted)
        assert "secret" in volume and mounts[next(m for m in mounts if trusted.startswith(m))]["readOnly"] is True


def test_autoscaling_follows_the_servers_saturation_gauge() -> None:
    rendered = Metrics(4).render().decode()
    assert "# TYPE heddle_run_saturation gauge" in rendered
    name = _deployment()["metadata"]["name"]
    (hpa,) = of_kind("HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == name
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == ["heddle_run_saturation"]
    (scaled,) = of_kind("ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == name
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and "heddle_run_saturation{" in trigger["metadata"]["query"]
    assert 0 < float(trigger["metadata"]["threshold"]) <= 1
