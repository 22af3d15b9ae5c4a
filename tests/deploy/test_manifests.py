"""deploy/kubernetes/ and the Containerfile agree with Kubernetes and with the server they run: every
rendering a user applies (the stateless base, the Postgres overlay, the production overlay with KEDA and
the ServiceMonitor, and the HPA component) is valid for its kind against the Kubernetes versions
docs/deploy.md names, and the operators' resources against their CRDs' schemas kept in
deploy/kubernetes/schemas; the base starts without the sessions Secret; nothing fights the autoscaler;
the parameters a cluster changes reach the resources; every `heddle-server` flag the image and the
Deployments pass is one `heddle-server --help` lists (and reads, values and all), and ports, probe paths,
the drain, volumes and the autoscaling metric are the server's own. In-process but for one
`heddle-server --help` and `kubectl kustomize`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from heddle import secret_env
from heddle.format.cache import CACHE_DIR_ENV
from heddle.oci.auth import REGISTRY_ENV
from heddle.server.cli import config_from
from heddle.server.config import check_config
from heddle.server.metrics import Metrics
from heddle.server.openapi import openapi_document
from heddle.server.serve import CANCEL_GRACE_S
from tests.deploy.image import MANIFESTS, Doc, expand, manifests, of_kind, read_image, render, server_container

REPO = MANIFESTS.parents[1]
# The Kubernetes versions docs/deploy.md says the manifests are for: the oldest and the newest.
K8S_VERSIONS = ("1.30.0", "1.34.0")
# The operators' kinds, checked against the schemas kept beside the manifests instead.
CRD_SCHEMAS = {"ScaledObject": MANIFESTS / "schemas" / "scaledobject.keda.sh-v1alpha1.json",
               "ServiceMonitor": MANIFESTS / "schemas" / "servicemonitor.monitoring.coreos.com-v1.json"}


def _deployments() -> Iterator[tuple[str, Doc]]:
    for where, doc in manifests():
        if doc["kind"] == "Deployment":
            yield where, doc


def _deployment() -> Doc:
    return of_kind("Deployment", "")[0]


def _hpa_rendering(tmp_path: Path) -> list[Doc]:
    """The Postgres overlay with the HPA component instead of KEDA, as a user's kustomization would put it."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "heddle",
        "resources": [os.path.relpath(MANIFESTS / "overlays" / "postgres", tmp_path)],
        "components": [os.path.relpath(MANIFESTS / "components" / "hpa", tmp_path)]}))
    return render(tmp_path)


def _validate_custom(doc: Doc) -> None:
    import jsonschema

    schema = json.loads(CRD_SCHEMAS[doc["kind"]].read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(schema).validate(doc)


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


def test_every_rendering_is_valid_for_kubernetes_and_the_operators_schemas(tmp_path: Path) -> None:
    # Imported here: at the top, every pytest worker would load it to collect the module.
    import jsonschema
    import kubernetes_validate  # type: ignore[import-untyped]

    docs = [*manifests(), *(("components/hpa", doc) for doc in _hpa_rendering(tmp_path))]
    seen = set()
    for where, doc in docs:
        seen.add(doc["kind"])
        name = f"{where}: {doc['kind']} {doc['metadata']['name']}"
        if doc["kind"] in CRD_SCHEMAS:
            try:
                _validate_custom(doc)
            except jsonschema.ValidationError as exc:
                raise AssertionError(f"{name}: {exc.message} at {list(exc.path)}") from None
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{name} ({version}): {exc.message} at {list(exc.path)}") from None
    assert {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ScaledObject",
            "ServiceMonitor"} <= seen
    assert "ConfigMap" not in seen, "the parameters are local to kustomize, never applied"
    deploy_md = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    for version in K8S_VERSIONS:
        assert f"Kubernetes {version.rsplit('.', 1)[0]}" in deploy_md, f"docs/deploy.md names no {version}"


def test_the_crd_schemas_refuse_what_their_operators_would(tmp_path: Path) -> None:
    import jsonschema

    for schema in CRD_SCHEMAS.values():
        assert "$comment" in json.loads(schema.read_text()), f"{schema.name}: its source and version are not noted"
    (scaled,) = of_kind("ScaledObject", "overlays/production")
    (monitor,) = of_kind("ServiceMonitor", "overlays/production")
    broken = [
        {**scaled, "spec": {**scaled["spec"], "minReplicas": 2}},  # HPA's name, not KEDA's
        {**scaled, "spec": {**scaled["spec"], "triggers": [{**scaled["spec"]["triggers"][0], "metadata": {
            **scaled["spec"]["triggers"][0]["metadata"], "threshold": 0.7}}]}},  # a number: KEDA wants a string
        {**monitor, "spec": {**monitor["spec"], "endpoints": [{**monitor["spec"]["endpoints"][0],
                                                               "interval": "15 seconds"}]}},
        {**monitor, "spec": {**monitor["spec"], "endpoints": [{**monitor["spec"]["endpoints"][0],
                                                               "bearerToken": "x"}]}},
    ]
    for doc in broken:
        with pytest.raises(jsonschema.ValidationError):
            _validate_custom(doc)


def test_no_field_fights_the_autoscaler(tmp_path: Path) -> None:
    # A replica count in the Deployment is put back on every apply, over what KEDA or the HPA chose.
    raw = yaml.safe_load((MANIFESTS / "base" / "deployment.yaml").read_text(encoding="utf-8"))
    assert "replicas" not in raw["spec"]
    for where, deployment in [*_deployments(), *(("components/hpa", d) for d in _hpa_rendering(tmp_path)
                                                   if d["kind"] == "Deployment")]:
        assert "replicas" not in deployment["spec"], f"{where}: the Deployment sets replicas"
    scalers = [d for _, d in manifests() if d["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert len(scalers) == 1, "one autoscaler, never two over the same Deployment"


def test_the_base_is_stateless_and_the_postgres_overlay_shares_sessions_with_recovery() -> None:
    def required_secrets(deployment: Doc) -> set[str]:
        refs = [e["valueFrom"]["secretKeyRef"] for e in server_container(deployment)["env"]
                if "secretKeyRef" in e.get("valueFrom", {})]
        volumes = [v["secret"] for v in deployment["spec"]["template"]["spec"]["volumes"] if "secret" in v]
        return ({r["name"] for r in refs if not r.get("optional")}
                | {v["secretName"] for v in volumes if not v.get("optional")})

    stateless, postgres = of_kind("Deployment", ""), of_kind("Deployment", "overlays/postgres")
    # Only what the server cannot serve without: the key it verifies bundles with, and its bearer token.
    assert required_secrets(stateless[0]) == {"heddle-trust", "heddle-auth"}
    assert required_secrets(postgres[0]) == {"heddle-trust", "heddle-auth", "heddle-sessions"}
    environ = {"HEDDLE_AUTH_TOKEN": "x"}
    base = config_from(_argv(server_container(stateless[0])), environ)
    assert base.settings.session_store is None
    container = server_container(postgres[0])
    assert {"HEDDLE_SESSION_STORE", "HEDDLE_SESSION_KEY"} <= set(_env(container))
    shared = config_from(_argv(container), {**environ, "HEDDLE_SESSION_STORE": "postgres://heddle@db/heddle"})
    assert shared.settings.session_store == "postgres://heddle@db/heddle" and shared.recover is True
    # The production overlay is the Postgres one with autoscaling and scraping added, nothing else changed.
    (production,) = of_kind("Deployment", "overlays/production")
    assert production == postgres[0]


def test_the_parameters_a_cluster_changes_reach_the_operators_resources(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(MANIFESTS, copy)
    overlay = copy / "overlays" / "production"
    parameters = yaml.safe_load((overlay / "parameters.yaml").read_text())
    parameters["data"] = {"prometheusAddress": "http://prometheus.observability.svc:9090",
                          "prometheusRelease": "monitoring-stack", "saturationTarget": "0.5"}
    (overlay / "parameters.yaml").write_text(yaml.safe_dump(parameters))
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    kustomization["namespace"] = "agents"
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    docs = {d["kind"]: d for d in render(overlay)}
    (trigger,) = docs["ScaledObject"]["spec"]["triggers"]
    assert trigger["metadata"]["serverAddress"] == "http://prometheus.observability.svc:9090"
    assert trigger["metadata"]["threshold"] == "0.5"
    assert 'namespace="agents"' in trigger["metadata"]["query"]
    assert docs["ServiceMonitor"]["metadata"]["labels"]["release"] == "monitoring-stack"
    assert {d["metadata"]["namespace"] for d in docs.values()} == {"agents"}
    # And as shipped: kube-prometheus-stack's default release label, its Prometheus Service.
    (monitor,) = of_kind("ServiceMonitor", "overlays/production")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (scaled,) = of_kind("ScaledObject", "overlays/production")
    assert 'namespace="heddle"' in scaled["spec"]["triggers"][0]["metadata"]["query"]


def test_every_flag_passed_is_one_heddle_server_takes_and_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # By the command's entry function in this process: the text the process prints (tests/server/test_startup.py's).
    from heddle.server.cli import run

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(["--help"], {}) == 0
    help_text = out.getvalue()
    listed = set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", help_text, flags=re.MULTILINE))
    for where, deployment in _deployments():
        container = server_container(deployment)
        argv = _argv(container)
        passed = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        assert passed - listed == set(), f"{where}: flags heddle-server does not take: {sorted(passed - listed)}"
        # And they read as the server reads them: values, durations, and what --pull-interval needs.
        environ = {name: "x" for name, e in _env(container).items() if "valueFrom" in e}
        if "HEDDLE_SESSION_STORE" in environ:
            environ["HEDDLE_SESSION_STORE"] = "postgres://heddle@db/heddle"
        config = config_from(argv, environ)
        check_config(config)
        assert config.pull_interval is not None and str(config.bundle).startswith("oci://")
        assert config.settings.session_store == environ.get("HEDDLE_SESSION_STORE")
        assert config.auth_token == "x", "the bearer token comes from the Secret through HEDDLE_AUTH_TOKEN"
        # Every variable of heddle's the pod sets is one heddle reads; the secret ones come from Secrets.
        known = {*secret_env.SECRET_ENV, REGISTRY_ENV, CACHE_DIR_ENV, "TMPDIR", "POD_NAMESPACE"}
        assert set(_env(container)) <= known, f"{where}: {sorted(set(_env(container)) - known)}"
        for name in secret_env.SECRET_ENV & set(_env(container)):
            assert "secretKeyRef" in _env(container)[name].get("valueFrom", {}), f"{where}: {name} is not from a Secret"


def test_ports_probes_and_the_drain_are_the_servers() -> None:
    deployment = _deployment()
    pod = deployment["spec"]["template"]["spec"]
    container = server_container(deployment)
    argv = _argv(container)
    config = config_from(argv, {"HEDDLE_AUTH_TOKEN": "x"})
    (port,) = container["ports"]
    assert port["containerPort"] == config.port and config.host in ("0.0.0.0", "::")
    routes = set(openapi_document("0", auth=True)["paths"])
    probes = {kind: container[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
    for kind, probe in probes.items():
        assert probe["path"] in routes, f"{kind} {probe['path']} is no route of the server"
        assert probe["port"] in (port["name"], port["containerPort"]), kind
    (service,) = of_kind("Service", "overlays/production")
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {port["name"], port["containerPort"]}
    pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    waits = float(pre_stop[-1]) if pre_stop[:1] == ["sleep"] else 0.0
    assert pod["terminationGracePeriodSeconds"] > waits + config.drain_timeout + CANCEL_GRACE_S
    (budget,) = of_kind("PodDisruptionBudget", "overlays/production")
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    for monitor in of_kind("ServiceMonitor", "overlays/production"):
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


def test_autoscaling_follows_the_servers_saturation_gauge(tmp_path: Path) -> None:
    rendered = Metrics(4).render().decode()
    assert "# TYPE heddle_run_saturation gauge" in rendered
    name = _deployment()["metadata"]["name"]
    (hpa,) = [d for d in _hpa_rendering(tmp_path) if d["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == name
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == ["heddle_run_saturation"]
    (scaled,) = of_kind("ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == name
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and "heddle_run_saturation{" in trigger["metadata"]["query"]
    assert 0 < float(trigger["metadata"]["threshold"]) <= 1
