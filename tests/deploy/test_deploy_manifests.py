"""deploy/: the kustomizations build, every rendered object validates offline against its schema,
and the manifests, compose file and Dockerfiles agree with each other and with the code (settings,
metric names, catalog)."""

import copy
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.keda import v1alpha1 as keda
from cloudcoil.models.prometheus_operator import v1 as monitoring
from prometheus_client import CollectorRegistry

from tokenyard.core.settings import Settings
from tokenyard.engine.metrics import EngineMetrics
from tokenyard.gateway import metrics as gateway_metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUSTOMIZATIONS = ["base", "overlays/dev", "overlays/prod"]
K8S_VERSION = "1.30"  # the oldest Kubernetes the manifests target (sleep-free preStop, policy/v1)
# CRDs, checked against models generated from KEDA's and prometheus-operator's own CRD schemas
CRD_MODELS = {
    ("keda.sh/v1alpha1", "ScaledObject"): keda.ScaledObject,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): monitoring.ServiceMonitor,
}
# environment variables the manifests may set that are not TOKENYARD_* settings
FOREIGN_ENV = {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "POSTGRES_PASSWORD"}
POSTGRES_IMAGE_ENV = {"POSTGRES_USER", "POSTGRES_DB", "POSTGRES_PASSWORD", "PGDATA"}


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed on this machine")
    return path


@cache
def _render_cached(kustomization: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        [_kubectl(), "kustomize", str(K8S / kustomization)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"kustomize build {kustomization} failed:\n{out.stderr}"
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert docs, f"{kustomization} rendered no objects"
    return tuple(docs)


def render(kustomization: str) -> list[dict[str, Any]]:
    return copy.deepcopy(list(_render_cached(kustomization)))


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def kinds(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def validate_object(obj: dict[str, Any]) -> None:
    """Raise unless obj is valid: the Kubernetes OpenAPI schema in strict mode (unknown fields are
    errors) for core kinds, the CRD's model for KEDA and prometheus-operator kinds."""
    model = CRD_MODELS.get((obj["apiVersion"], obj["kind"]))
    if model is None:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        return
    parsed = model.model_validate(obj)
    # the models ignore unknown fields; a field they dropped is one the CRD does not have
    dumped = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if dumped != obj:
        raise ValueError(f"{obj['kind']} has fields its CRD does not define: {_diff(obj, dumped)}")


def _diff(given: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        out = [f"{path}.{k}" for k in given if k not in kept]
        for k in given.keys() & kept.keys():
            out += _diff(given[k], kept[k], f"{path}.{k}")
        return out
    if isinstance(given, list) and isinstance(kept, list):
        pairs = enumerate(zip(given, kept, strict=False))
        return [p for i, (g, k) in pairs for p in _diff(g, k, f"{path}[{i}]")] + (
            [f"{path}: {len(given)} items, {len(kept)} kept"] if len(given) != len(kept) else []
        )
    return [] if given == kept else [f"{path}: {given!r} != {kept!r}"]


# --- the kustomizations build and validate ---------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_rendered_object_validates_against_its_schema(kustomization: str) -> None:
    docs = render(kustomization)
    errors = []
    for obj in docs:
        try:
            validate_object(obj)
        except Exception as exc:  # every kind of validation failure, collected
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc}")
    assert not errors, "\n".join(errors)
    for obj in docs:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == "tokenyard", obj["metadata"]


def test_the_validators_reject_what_is_wrong() -> None:
    """The checks above are not vacuous: a misspelt field, a wrong type and a CRD field that does
    not exist are all caught."""
    docs = render("base")
    gateway = find(docs, "Deployment", "gateway")
    typo = copy.deepcopy(gateway)
    typo["spec"]["replica"] = typo["spec"].pop("replicas")
    wrong_type = copy.deepcopy(gateway)
    container(wrong_type, "gateway")["ports"][0]["containerPort"] = "eight thousand"
    scaled = find(docs, "ScaledObject", "engine")
    crd_typo = copy.deepcopy(scaled)
    crd_typo["spec"]["minReplicas"] = crd_typo["spec"].pop("minReplicaCount")
    crd_type = copy.deepcopy(scaled)
    crd_type["spec"]["triggers"][0]["metadata"]["threshold"] = 0.7  # KEDA wants strings
    monitor = copy.deepcopy(find(docs, "ServiceMonitor", "engine"))
    monitor["spec"]["endpoint"] = monitor["spec"].pop("endpoints")
    for bad in (typo, wrong_type, crd_typo, crd_type, monitor):
        with pytest.raises(Exception):  # noqa: B017 - validation errors of three libraries
            validate_object(bad)
    validate_object(gateway)  # and the unchanged objects pass
    validate_object(scaled)


def test_base_has_every_piece_the_platform_needs() -> None:
    names = kinds(render("base"))
    for expected in [
        ("Namespace", "tokenyard"),
        ("Deployment", "gateway"),
        ("Service", "gateway"),
        ("HorizontalPodAutoscaler", "gateway"),
        ("PodDisruptionBudget", "gateway"),
        ("StatefulSet", "engine"),
        ("Service", "engine"),
        ("PodDisruptionBudget", "engine"),
        ("ScaledObject", "engine"),
        ("StatefulSet", "redis"),
        ("Service", "redis"),
        ("StatefulSet", "postgres"),
        ("Service", "postgres"),
        ("ServiceMonitor", "gateway"),
        ("ServiceMonitor", "engine"),
    ]:
        assert expected in names, expected
    prefixes = {name.rsplit("-", 1)[0] for kind, name in names if kind in ("ConfigMap", "Secret")}
    assert prefixes == {"model-catalog", "provider-keys", "database"}


def test_dev_is_one_small_cpu_engine_without_cluster_addons() -> None:
    docs = render("overlays/dev")
    names = kinds(docs)
    assert not {k for k, _ in names} & {"ScaledObject", "ServiceMonitor", "HorizontalPodAutoscaler"}
    engine = find(docs, "StatefulSet", "engine")
    assert engine["spec"]["replicas"] == 1
    c = container(engine, "engine")
    assert env_of(c)["TOKENYARD_ENGINE_DEVICE"] == "cpu"
    assert c["image"].startswith("tokenyard/engine-cpu:")
    resources = c["resources"]
    assert "nvidia.com/gpu" not in {**resources.get("requests", {}), **resources.get("limits", {})}
    assert "tolerations" not in engine["spec"]["template"]["spec"]
    assert find(docs, "Deployment", "gateway")["spec"]["replicas"] == 1
    assert ("StatefulSet", "postgres") in names


def test_prod_is_gpu_more_replicas_and_external_postgres() -> None:
    docs = render("overlays/prod")
    names = kinds(docs)
    assert ("StatefulSet", "postgres") not in names
    assert ("Service", "postgres") not in names
    base_gw = find(render("base"), "Deployment", "gateway")
    gateway = find(docs, "Deployment", "gateway")
    assert gateway["spec"]["replicas"] > base_gw["spec"]["replicas"]
    scaled = find(docs, "ScaledObject", "engine")
    assert scaled["spec"]["minReplicaCount"] >= 2
    engine = find(docs, "StatefulSet", "engine")
    assert container(engine, "engine")["resources"]["limits"]["nvidia.com/gpu"] == 1
    db = _secret_env(docs, "database")
    assert "@postgres:" not in db["TOKENYARD_DATABASE_URL"]  # not the in-cluster one


def _secret_env(docs: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    import base64

    (secret,) = [
        d
        for d in docs
        if d["kind"] == "Secret" and d["metadata"]["name"].rsplit("-", 1)[0] == prefix
    ]
    return {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}


# --- the manifests agree with the code --------------------------------------------------------


def _manifest_env_names(docs: list[dict[str, Any]]) -> set[str]:
    names: set[str] = set()
    for d in docs:
        if d["kind"] == "Secret":
            names |= set(_secret_env(docs, d["metadata"]["name"].rsplit("-", 1)[0]))
        pod = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            if c["image"].startswith("postgres:"):
                assert set(env_of(c)) <= POSTGRES_IMAGE_ENV, env_of(c)
                continue
            names |= set(env_of(c))
    return names


def _check_env(names: set[str], where: str) -> None:
    fields = set(Settings.model_fields)
    unknown = sorted(
        n
        for n in names
        if n not in FOREIGN_ENV
        and not (n.startswith("TOKENYARD_") and n.removeprefix("TOKENYARD_").lower() in fields)
    )
    assert not unknown, f"{where} sets variables Settings does not read: {unknown}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_env_var_the_manifests_set_is_a_setting(kustomization: str) -> None:
    names = _manifest_env_names(render(kustomization))
    assert "TOKENYARD_ENGINE_URLS" in names and "TOKENYARD_DATABASE_URL" in names
    _check_env(names, kustomization)


def test_the_env_check_catches_drift() -> None:
    with pytest.raises(AssertionError, match="TOKENYARD_GATEWAY_LEASE_SECONDS"):
        _check_env({"TOKENYARD_GATEWAY_LEASE_SECONDS", "TOKENYARD_REDIS_URL"}, "test")


def _engine_replicas_named(url_spec: str) -> list[int]:
    ordinals = []
    for item in url_spec.split(","):
        model, _, url = item.partition("=")
        m = re.fullmatch(r"http://engine-(\d+)\.engine:(\d+)", url)
        assert m, f"not a replica of the engine StatefulSet's headless Service: {item}"
        assert model == "smollm2" and m.group(2) == "8100"
        ordinals.append(int(m.group(1)))
    return ordinals


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_gateway_engine_urls_name_every_replica_the_engines_can_scale_to(
    kustomization: str,
) -> None:
    docs = render(kustomization)
    engine = find(docs, "StatefulSet", "engine")
    service = find(docs, "Service", "engine")
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per replica
    assert engine["spec"]["serviceName"] == "engine"
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    most = scaled[0]["spec"]["maxReplicaCount"] if scaled else engine["spec"]["replicas"]
    gateway = container(find(docs, "Deployment", "gateway"), "gateway")
    urls = env_of(gateway)["TOKENYARD_ENGINE_URLS"]
    assert _engine_replicas_named(urls) == list(range(most))
    if scaled:
        target = scaled[0]["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("StatefulSet", "engine")
        assert scaled[0]["spec"]["minReplicaCount"] >= 1  # warm: never scaled to zero
        assert engine["spec"]["replicas"] == scaled[0]["spec"]["minReplicaCount"]


def _metric_names(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names |= {sample.name for sample in family.samples} | {family.name}
    return names


def test_autoscaling_queries_use_the_metrics_the_processes_export() -> None:
    docs = render("base")
    engine_metrics = _metric_names(EngineMetrics("smollm2").registry)
    scaled = find(docs, "ScaledObject", "engine")
    queried = set()
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        query = trigger["metadata"]["query"]
        queried |= set(re.findall(r"tokenyard_[a-z_]+", query))
        float(trigger["metadata"]["threshold"])
    assert queried == {"tokenyard_engine_kv_usage_ratio", "tokenyard_engine_waiting"}
    assert queried <= engine_metrics
    hpa = find(docs, "HorizontalPodAutoscaler", "gateway")
    pods = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert pods == ["tokenyard_gateway_in_flight"]
    assert set(pods) <= _metric_names(gateway_metrics.REGISTRY)
    assert {m["type"] for m in hpa["spec"]["metrics"]} == {"Resource", "Pods"}
    # the ServiceMonitors scrape the named port of the Services the queries select on
    for name, port in (("gateway", 8000), ("engine", 8100)):
        monitor = find(docs, "ServiceMonitor", name)
        assert monitor["spec"]["endpoints"][0]["port"] == "http"
        assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
        svc = find(docs, "Service", name)
        assert (
            svc["metadata"]["labels"]
            == svc["metadata"]["labels"] | (monitor["spec"]["selector"]["matchLabels"])
        )
        pod = find(docs, "Deployment" if name == "gateway" else "StatefulSet", name)
        annotations = pod["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port)
        assert container(pod, name)["ports"][0]["containerPort"] == port


def _drain_s(c: dict[str, Any], setting: str) -> float:
    return float(env_of(c).get(setting, Settings.model_fields[setting.lower()[10:]].default))


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_probes_and_drain_fit_together(kustomization: str) -> None:
    docs = render(kustomization)
    for kind, name, drain in (
        ("Deployment", "gateway", "TOKENYARD_GATEWAY_DRAIN_S"),
        ("StatefulSet", "engine", "TOKENYARD_ENGINE_DRAIN_S"),
    ):
        workload = find(docs, kind, name)
        c = container(workload, name)
        pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep"
        grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        # the kubelet's SIGKILL must come after preStop + the process's own drain deadline
        assert grace > float(pre_stop[1]) + _drain_s(c, drain), (kind, name)
    gateway = container(find(docs, "Deployment", "gateway"), "gateway")
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    engine = container(find(docs, "StatefulSet", "engine"), "engine")
    # the engine listens only once its weights are loaded: /health answering means loaded
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert engine[probe]["httpGet"]["path"] == "/health", probe
    startup = engine["startupProbe"]
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    gpu = "nvidia.com/gpu" in engine["resources"].get("limits", {})
    assert budget >= (600 if gpu else 120), f"{budget} s is too short for weight loading"
    for c in (gateway, engine):
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
    for workload in (find(docs, "Deployment", "gateway"), find(docs, "StatefulSet", "engine")):
        assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_gateway_mounts_the_catalog_configmap_at_tokenyard_catalog() -> None:
    docs = render("base")
    workload = find(docs, "Deployment", "gateway")
    c = container(workload, "gateway")
    path = Path(env_of(c)["TOKENYARD_CATALOG"])
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent)]
    (volume,) = [
        v for v in workload["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    (cm,) = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    ]
    assert tomllib.loads(cm["data"][path.name]) == tomllib.loads(
        (ROOT / "tokenyard" / "router" / "catalog.toml").read_text()
    )
    assert {m["secretRef"]["name"].rsplit("-", 1)[0] for m in c["envFrom"]} == {
        "database",
        "provider-keys",
    }


def test_the_deployed_catalog_is_router_catalog() -> None:
    """kustomize reads no file outside the kustomization, so the base carries a copy."""
    copy_ = (K8S / "base" / "catalog.toml").read_text()
    assert copy_ == (ROOT / "tokenyard" / "router" / "catalog.toml").read_text(), (
        "cp tokenyard/router/catalog.toml deploy/k8s/base/catalog.toml"
    )


def test_example_secret_files_hold_no_keys() -> None:
    for path in K8S.rglob("*.env.example"):
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.endswith("_API_KEY"):
                assert value == "", f"{path}: {key} must stay empty in the repository"


# --- compose ------------------------------------------------------------------------------------


class _ComposeLoader(yaml.SafeLoader):
    """Compose's own tags (`!reset`, `!override`) as plain values."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: None)
_ComposeLoader.add_constructor(
    "!override",
    lambda loader, node: (
        loader.construct_mapping(node) if isinstance(node, yaml.MappingNode) else None
    ),
)


def load_compose(name: str) -> dict[str, Any]:
    return yaml.load((DEPLOY / name).read_text(), Loader=_ComposeLoader)


def _url_host(url: str) -> str:
    return re.match(r"[a-z+]+://(?:[^@/]*@)?([^:/]+)", url).group(1)


def test_compose_parses_and_wires_redis_postgres_engine_and_two_gateways() -> None:
    compose = load_compose("compose.yaml")
    services = compose["services"]
    gateways = [s for s in services if s.startswith("gateway")]
    assert {"redis", "postgres", "engine"} <= set(services) and len(gateways) == 2
    for name, service in services.items():
        assert "healthcheck" in service, name
        for dep, cond in service.get("depends_on", {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert cond["condition"] == "service_healthy"
            assert "healthcheck" in services[dep]
        build = service.get("build")
        if build:
            assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()
    k8s_images = {
        c["image"].split(":")[0]
        for d in render("base")
        if d["kind"] in ("Deployment", "StatefulSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    postgres = services["postgres"]["environment"]
    for name in gateways:
        gw = services[name]
        assert {"redis", "postgres", "engine"} <= set(gw["depends_on"])
        env = gw["environment"]
        assert _url_host(env["TOKENYARD_REDIS_URL"]) == "redis"
        db = env["TOKENYARD_DATABASE_URL"]
        assert db.startswith("postgresql+psycopg://") and _url_host(db) == "postgres"
        assert f"{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@" in db
        assert db.endswith("/" + postgres["POSTGRES_DB"])
        for item in env["TOKENYARD_ENGINE_URLS"].split(","):
            assert _url_host(item.partition("=")[2]) in services
        _check_env(set(env), f"compose {name}")
        assert gw["image"].split(":")[0] in k8s_images
        assert len({p.split(":")[0] for p in gw["ports"]}) == 1
    host_ports = [services[g]["ports"][0].split(":")[0] for g in gateways]
    assert len(set(host_ports)) == 2, "the two gateways need different host ports"
    engine = services["engine"]
    _check_env(set(engine["environment"]), "compose engine")
    assert engine["image"].split(":")[0] in k8s_images
    (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]


def test_compose_cpu_override_swaps_in_the_cpu_engine() -> None:
    base = load_compose("compose.yaml")["services"]
    cpu = load_compose("compose.cpu.yaml")["services"]
    assert set(cpu) <= set(base)
    engine = cpu["engine"]
    assert engine["deploy"] is None  # `!reset`: no GPU reservation
    assert engine["environment"]["TOKENYARD_ENGINE_DEVICE"] == "cpu"
    _check_env(set(engine["environment"]), "compose.cpu engine")
    dockerfile = (DEPLOY / engine["build"]["context"] / engine["build"]["dockerfile"]).read_text()
    assert re.search(rf"^FROM .* AS {engine['build']['target']}$", dockerfile, re.M)
    assert engine["image"].split(":")[0] == "tokenyard/engine-cpu"
    dev = render("overlays/dev")
    assert container(find(dev, "StatefulSet", "engine"), "engine")["image"].startswith(
        engine["image"].split(":")[0] + ":"
    )


# --- images -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", ["gateway.Dockerfile", "engine.Dockerfile"])
def test_dockerfiles_are_multi_stage_non_root_with_health_checks(dockerfile: str) -> None:
    text = (DEPLOY / "docker" / dockerfile).read_text()
    lines = [ln.strip() for ln in re.sub(r"\\\n", " ", text).splitlines()]
    stages = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(stages) >= 2, "multi-stage"
    # every final image (a stage that sets ENTRYPOINT) runs as a non-root user and checks health
    blocks = re.split(r"^FROM ", text, flags=re.M)[1:]
    finals = [b for b in blocks if "ENTRYPOINT" in b]
    assert finals
    for block in finals:
        users = re.findall(r"^USER (\S+)", block, re.M)
        assert users and users[-1].split(":")[0] not in ("root", "0"), block.splitlines()[0]
        assert re.search(r"^HEALTHCHECK .*CMD", re.sub(r"\\\n", " ", block), re.M)
        assert "/health" in block
    for ln in lines:
        m = re.match(r"COPY (?!--from)(\S+) ", ln)
        if m:
            for src in ln.split()[1:-1]:
                assert (ROOT / src).exists(), f"{dockerfile}: COPY {src}: no such path"
    env = set(re.findall(r"\b(TOKENYARD_[A-Z_]+)=", text))
    _check_env(env, dockerfile)
    if dockerfile == "engine.Dockerfile":
        assert re.search(r"^FROM nvidia/cuda:\S+-runtime-", text, re.M)
        assert "flash-attn" in text or "[cuda]" in text
    else:
        assert "python:3.11-slim" in text
        assert "download.pytorch.org/whl/cpu" in text


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    patterns = {
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    assert {".git", ".venv", "var", "*.env"} <= patterns
    # and nothing the images COPY is ignored
    for dockerfile in ("gateway.Dockerfile", "engine.Dockerfile"):
        for src in re.findall(
            r"^COPY (?!--from)(.+) \S+$", (DEPLOY / "docker" / dockerfile).read_text(), re.M
        ):
            for path in src.split():
                assert path not in patterns


# --- graceful drain in the processes ------------------------------------------------------------


def test_gateway_serve_passes_the_drain_deadline_to_uvicorn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    from tokenyard import serve

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    serve.serve(Settings(gateway_drain_s=42.0), "127.0.0.1", 0)
    assert seen["timeout_graceful_shutdown"] == 42.0
    serve.serve(Settings(gateway_drain_s=0), "127.0.0.1", 0)
    assert seen["timeout_graceful_shutdown"] is None  # 0: no deadline


def test_gateway_serve_believes_forwarded_headers_only_from_its_trusted_proxies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    from tokenyard import serve

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    serve.serve(Settings(gateway_trusted_proxies="10.0.0.0/8,192.168.1.5"), "127.0.0.1", 0)
    assert seen["proxy_headers"] is True
    assert seen["forwarded_allow_ips"] == "10.0.0.0/8,192.168.1.5"


def test_engine_drain_flag_defaults_to_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from tokenyard.core import settings
    from tokenyard.engine import cli

    monkeypatch.setenv("TOKENYARD_ENGINE_DRAIN_S", "17")
    settings.get_settings.cache_clear()
    try:
        parser = argparse.ArgumentParser()
        cli.add_parser(parser.add_subparsers())
        assert parser.parse_args(["engine"]).drain_s == 17.0
        assert parser.parse_args(["engine", "--drain-s", "5"]).drain_s == 5.0
    finally:
        settings.get_settings.cache_clear()
