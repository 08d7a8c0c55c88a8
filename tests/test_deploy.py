"""Consistency of deploy/: the image, compose, Prometheus, Grafana and Kubernetes files agree with each
other and with the server (its config fields and defaults, its metric names). Nothing here needs a
container engine or a cluster; the two helper scripts of the image (healthcheck, kernel cache warm-up)
are run against a real server in this process.
"""
from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import fields
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from sapcore import FrameStats
from sapgrid.server.config import ServerConfig, from_args
from sapgrid.server.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "sapgrid.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
K8S = DEPLOY / "k8s"
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
CONFIG_ENV = {"SAPGRID_" + f.name.upper() for f in fields(ServerConfig)}


# ---------------------------------------------------------------------------------------------
# parsing helpers
# ---------------------------------------------------------------------------------------------
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """[(INSTRUCTION, arguments)] with continuation lines joined and comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def dockerfile_env(instr) -> dict[str, str]:
    env = {}
    for word, args in instr:
        if word == "ENV":
            for tok in shlex.split(args):
                assert "=" in tok, f"ENV without '=': {args!r} (use ENV KEY=VALUE)"
                k, v = tok.split("=", 1)
                env[k] = v
    return env


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(x, str) for x in value), args
    return value


def env_list(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def load_yaml_docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def compose_ports(service: dict) -> list[tuple[int, int]]:
    """[(published, target)] of "[host_ip:]published:target" entries."""
    out = []
    for p in service.get("ports", []):
        parts = str(p).split("/")[0].split(":")
        out.append((int(parts[-2]), int(parts[-1])))
    return out


def metric_catalog() -> dict[str, set[str]]:
    """Every sample name the server exports (counter _total, histogram _bucket/_sum/_count, process
    metrics) -> its label names, from a real Metrics registry with every kind of series created."""
    m = Metrics()
    m.world_created("w", 1)
    m.frame_applied("w", FrameStats(objects=1, pairs=1, created=1, deleted=1, swaps=1, cell_overflows=1,
                                    validate_s=0.001, rasterize_s=0.001, apply_s=0.001, merge_s=0.001, total_s=0.001),
                    queue_s=0.001, server_s=0.001)
    m.frame_rejected("w", "invalid_argument")
    m.set_queue_depth("w", 1)
    m.set_subscribers("w", 1)
    m.subscriber_dropped("w")
    m.set_occupancy("w", np.array([0, 1, 3]))
    names: dict[str, set[str]] = {}
    for fam in m.registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "summary": ("", "_sum", "_count")}.get(fam.type, ("",))
        for sfx in suffixes:
            names.setdefault(fam.name + sfx, set())
        for s in fam.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


PROMQL_WORDS = {"sum", "by", "without", "rate", "irate", "increase", "histogram_quantile", "and", "or", "unless",
                "on", "ignoring", "group_left", "group_right", "avg", "max", "min", "count", "topk", "bottomk",
                "label_values", "le", "bool", "offset"}


def promql_metrics(expr: str) -> set[str]:
    """Metric names in a PromQL expression (identifiers outside braces, brackets and strings that are
    not functions, keywords or grouping labels)."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_matchers = re.sub(r"\{[^}]*\}", "{}", no_strings)
    no_ranges = re.sub(r"\[[^\]]*\]", "[]", no_matchers)
    no_groups = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", no_ranges)
    words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", no_groups))
    return {w for w in words if w not in PROMQL_WORDS and not w.startswith("$")
            and not re.search(rf"\b{re.escape(w)}\s*\(", no_groups)}


def promql_labels(expr: str) -> set[str]:
    """Label names a PromQL expression groups or matches by."""
    labels = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in group.split(",") if x.strip())
    for matchers in re.findall(r"\{([^}]*)\}", re.sub(r'"[^"]*"', '""', expr)):
        labels.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return labels


def dashboard_queries(dash: dict) -> list[tuple[str, str, str]]:
    """[(where, expr, legendFormat)] of every panel target and query variable."""
    out = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('title')!r} {t.get('refId')}", t["expr"], t.get("legendFormat", "")))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and q:
            m = re.fullmatch(r"label_values\((.+),\s*(\w+)\s*\)", q.strip())
            # label_values(SELECTOR, LABEL): check the selector, and LABEL as if it were a legend
            out.append((f"variable {v['name']!r}", m.group(1), "{{%s}}" % m.group(2)) if m
                       else (f"variable {v['name']!r}", q, ""))
    return out


# ---------------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def docker():
    instr = dockerfile_instructions(DOCKERFILE.read_text())
    return SimpleNamespace(instr=instr, env=dockerfile_env(instr))


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def k8s():
    docs = [d for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml" for d in load_yaml_docs(p)]
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    dep, = by_kind["StatefulSet"]
    svc, = by_kind["Service"]
    container, = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "sapgrid"]
    return SimpleNamespace(docs=docs, deployment=dep, service=svc, container=container)


def image_config(docker, extra_env: dict[str, str]) -> ServerConfig:
    """The server config a container of the image gets: image ENV, overridden by extra_env."""
    env = {k: v for k, v in docker.env.items() if k.startswith("SAPGRID_")}
    env.update(extra_env)
    return from_args(env=env)


# ---------------------------------------------------------------------------------------------
# files parse
# ---------------------------------------------------------------------------------------------
def test_every_yaml_file_parses():
    names = {p.relative_to(DEPLOY).as_posix() for p in YAML_FILES}
    assert {"compose.yaml", "prometheus/prometheus.yml", "k8s/statefulset.yaml", "k8s/service.yaml",
            "k8s/kustomization.yaml", "grafana/provisioning/datasources/prometheus.yml",
            "grafana/provisioning/dashboards/sapgrid.yml"} <= names
    for p in YAML_FILES:
        docs = load_yaml_docs(p)
        assert docs and all(isinstance(d, dict) for d in docs), p


def test_every_json_file_parses():
    files = sorted(DEPLOY.rglob("*.json"))
    assert DASHBOARD in files
    for p in files:
        assert isinstance(json.loads(p.read_text()), dict), p


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization"
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == manifests


# ---------------------------------------------------------------------------------------------
# the image
# ---------------------------------------------------------------------------------------------
def test_dockerfile_base_user_entrypoint(docker):
    words = [w for w, _ in docker.instr]
    assert docker.instr[0] == ("FROM", "python:3.11-slim-bookworm")
    users = [a for w, a in docker.instr if w == "USER"]
    assert users, "the image must not run as root"
    last_user = users[-1].split(":")[0]
    assert last_user not in ("root", "0"), last_user
    assert words.index("ENTRYPOINT") > len(words) - 1 - words[::-1].index("USER")
    entry, = [exec_form(a) for w, a in docker.instr if w == "ENTRYPOINT"]
    assert entry == ["sapgrid", "serve"]
    runs = " ".join(a for w, a in docker.instr if w == "RUN")
    assert re.search(r"apt-get install\b.*\blibgomp1\b", runs), "numba's OpenMP layer needs libgomp1"


def test_dockerfile_installs_every_package_folder(docker):
    """pip installs from the copied sources: every package folder of pyproject.toml is copied."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = set(project["tool"]["setuptools"]["package-dir"].values())
    copied = set()
    for w, a in docker.instr:
        if w == "COPY":
            copied.update(s.rstrip("/") for s in a.split()[:-1] if not s.startswith("--"))
    assert {"pyproject.toml", project["project"]["readme"]} <= copied
    missing = {d for d in dirs if not any(d == c or d.startswith(c + "/") for c in copied)}
    assert not missing, f"not copied into the image: {missing}"
    assert any(w == "RUN" and re.search(r"\bpip install\b", a) for w, a in docker.instr)


def test_dockerfile_copy_sources_are_in_the_build_context(docker):
    """Every COPY source exists at the repository root and is not excluded by .dockerignore."""
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    assert {".git", ".venv"} <= set(ignore)
    for w, a in docker.instr:
        if w != "COPY":
            continue
        for src in [s for s in a.split()[:-1] if not s.startswith("--")]:
            assert (ROOT / src).exists(), f"COPY {src}: no such file in the build context"
            parts = Path(src).parts
            for pat in ignore:
                for i in range(1, len(parts) + 1):
                    prefix = "/".join(parts[:i])
                    assert not fnmatch.fnmatch(prefix, pat.lstrip("/")), f"COPY {src} is excluded by {pat!r}"


def test_dockerfile_env_and_expose_match_the_server(docker):
    for k in docker.env:
        if k.startswith("SAPGRID_"):
            assert k in CONFIG_ENV, f"{k} is not a server config field"
    cfg = image_config(docker, {})
    assert host_of(cfg.listen) == "0.0.0.0" and cfg.metrics_host == "0.0.0.0", "unreachable from outside"
    exposed = {int(p.split("/")[0]) for w, a in docker.instr if w == "EXPOSE" for p in a.split()}
    assert exposed == {port_of(cfg.listen), cfg.metrics_port}


def test_dockerfile_warms_the_kernel_cache_as_the_runtime_user(docker):
    cache_dir = docker.env.get("NUMBA_CACHE_DIR")
    assert cache_dir and cache_dir.startswith("/")
    words = [w for w, _ in docker.instr]
    warm = [i for i, (w, a) in enumerate(docker.instr) if w == "RUN" and "warm_cache.py" in a]
    assert warm, "no kernel warm-up at build time"
    assert warm[0] > words.index("USER"), "warm-up must run as the runtime user (it owns the cache files)"
    runs = " ".join(a for w, a in docker.instr[:warm[0]] if w == "RUN")
    assert cache_dir in runs, "NUMBA_CACHE_DIR is never created"


def test_image_helper_scripts_are_copied_where_they_are_used(docker, compose):
    dests = {}
    for w, a in docker.instr:
        if w == "COPY":
            *srcs, dest = [s for s in a.split() if not s.startswith("--")]
            for s in srcs:
                dests[(dest.rstrip("/") + "/" + Path(s).name) if dest.endswith("/") else dest] = s
    used = []
    for w, a in docker.instr:
        if w in ("RUN", "HEALTHCHECK"):
            used += re.findall(r"/opt/\S+?\.py", a)
    used += re.findall(r"/opt/\S+?\.py", " ".join(compose["services"]["sapgrid"]["healthcheck"]["test"]))
    assert used
    for path in used:
        assert path in dests, f"{path} is used but not copied into the image"
        assert (ROOT / dests[path]).is_file()


# ---------------------------------------------------------------------------------------------
# compose + Prometheus + Grafana
# ---------------------------------------------------------------------------------------------
def test_compose_sapgrid_ports_match_server_config(docker, compose):
    svc = compose["services"]["sapgrid"]
    assert svc["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (COMPOSE.parent / svc["build"]["context"]).resolve() == ROOT
    env = compose_env(svc)
    cfg = image_config(docker, env)
    assert host_of(cfg.listen) == "0.0.0.0" and cfg.metrics_host == "0.0.0.0"
    targets = {t for _, t in compose_ports(svc)}
    assert targets == {port_of(cfg.listen), cfg.metrics_port}
    exposed = {int(p.split("/")[0]) for w, a in docker.instr if w == "EXPOSE" for p in a.split()}
    assert targets <= exposed


def test_compose_healthcheck_and_stop_grace(docker, compose):
    svc = compose["services"]["sapgrid"]
    test = svc["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and "healthcheck.py" in " ".join(test)
    cfg = image_config(docker, compose_env(svc))
    m = re.fullmatch(r"(\d+)s", svc["stop_grace_period"])
    assert m and int(m.group(1)) > cfg.grace_seconds + 6, "SIGKILL would cut the graceful shutdown short"


def test_prometheus_scrapes_the_sapgrid_metrics_port(docker, compose):
    prom = yaml.safe_load(PROMETHEUS.read_text())
    job, = [j for j in prom["scrape_configs"] if j["job_name"] == "sapgrid"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    cfg = image_config(docker, compose_env(compose["services"]["sapgrid"]))
    assert targets == [f"sapgrid:{cfg.metrics_port}"]
    prom_svc = compose["services"]["prometheus"]
    mounts = [v.split(":") for v in prom_svc["volumes"]]
    assert any((COMPOSE.parent / src).resolve() == PROMETHEUS and dst == "/etc/prometheus/prometheus.yml"
               for src, dst, *_ in mounts)
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom_svc["command"]


def test_grafana_provisioning_points_at_the_compose_services(compose):
    ds = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    prom, = [d for d in ds if d["type"] == "prometheus"]
    assert prom["url"] == "http://prometheus:9090" and "prometheus" in compose["services"]
    graf = compose["services"]["grafana"]
    mounts = {dst: (COMPOSE.parent / src).resolve() for src, dst, *_ in (v.split(":") for v in graf["volumes"])
              if src.startswith(".")}
    assert mounts["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/sapgrid.yml").read_text())["providers"]
    path = providers[0]["options"]["path"]
    assert mounts[path] == DASHBOARD.parent
    # every datasource reference of the dashboard is the provisioned one
    refs = re.findall(r'"datasource":\s*\{[^}]*"uid":\s*"([^"]+)"', DASHBOARD.read_text())
    assert refs and set(refs) == {prom["uid"]}


def test_dashboard_queries_use_real_metrics_and_labels():
    catalog = metric_catalog()
    dash = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dash)
    used = set()
    for where, expr, legend in queries:
        names = promql_metrics(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - set(catalog)
        assert not unknown, f"{where}: {sorted(unknown)} not exported by the server ({expr!r})"
        labels = set().union(*(catalog[n] for n in names)) | {"le", "job", "instance"}
        bad = promql_labels(expr) - labels
        assert not bad, f"{where}: labels {sorted(bad)} not on {sorted(names)}"
        legend_labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        assert legend_labels <= labels, f"{where}: legend {legend!r}"
        used |= names
    # the panels the dashboard promises
    for name in ("sapgrid_frames_total", "sapgrid_frame_duration_seconds_bucket", "sapgrid_world_objects",
                 "sapgrid_world_pairs", "sapgrid_pairs_created_total", "sapgrid_pairs_deleted_total",
                 "sapgrid_endpoint_swaps_total", "sapgrid_world_queue_depth", "sapgrid_occupied_cells",
                 "sapgrid_gc_pause_seconds_bucket"):
        assert name in used, f"dashboard shows no {name}"
    exprs = " ".join(e for _, e, _ in queries)
    for q in ("0.5", "0.99"):
        assert re.search(rf"histogram_quantile\({q}, sum by \((le, phase|phase, le)\)", exprs), q


def test_promql_parser_finds_names():
    """The dashboard check above relies on this extraction."""
    assert promql_metrics('histogram_quantile(0.99, sum by (le, phase) (rate(a_b_bucket{world=~"$w"}[5m])))') \
        == {"a_b_bucket"}
    assert promql_metrics("rate(x_total[$__rate_interval]) and on (instance) y") == {"x_total", "y"}
    assert promql_labels('sum by (outcome) (rate(f{world=~"$world", a!="b"}[1m]))') == {"outcome", "world", "a"}


# ---------------------------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------------------------
def test_k8s_env_is_server_config(docker, k8s):
    env = env_list(k8s.container)
    for k in env:
        if k.startswith("SAPGRID_"):
            assert k in CONFIG_ENV, f"{k} is not a server config field"
    cfg = image_config(docker, env)
    assert host_of(cfg.listen) == "0.0.0.0" and cfg.metrics_host == "0.0.0.0"


def test_k8s_ports_probes_and_service_match(docker, k8s):
    cfg = image_config(docker, env_list(k8s.container))
    ports = {p["name"]: p["containerPort"] for p in k8s.container["ports"]}
    assert ports == {"grpc": port_of(cfg.listen), "metrics": cfg.metrics_port}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe == "startupProbe" and probe not in k8s.container:
            continue
        assert k8s.container[probe]["grpc"]["port"] == ports["grpc"], probe
        want = "sapgrid.v1.SapgridService" if probe == "readinessProbe" else ""   # readiness: the service
        assert k8s.container[probe]["grpc"].get("service", "") == want, probe
    svc_ports = {p["name"]: p for p in k8s.service["spec"]["ports"]}
    assert set(svc_ports) == {"grpc", "metrics"}
    for name, p in svc_ports.items():
        target = p.get("targetPort", p["port"])
        assert target in (name, ports[name]), f"Service port {name} targets {target}"
        assert p["port"] == ports[name]
    selector = k8s.service["spec"]["selector"]
    labels = k8s.deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert k8s.deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ann = k8s.deployment["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == cfg.metrics_port
    assert ann.get("prometheus.io/path", "/metrics") == "/metrics"


def test_k8s_single_replica_and_shutdown_budget(docker, k8s):
    spec = k8s.deployment["spec"]
    assert spec["replicas"] == 1, "worlds live in one process: no replicas (shard with the cluster instead)"
    assert spec["updateStrategy"]["type"] == "RollingUpdate"      # a StatefulSet's pod goes before its successor
    cfg = image_config(docker, env_list(k8s.container))
    pod = spec["template"]["spec"]
    # grace for open calls, +5 s for the worlds' queued frames, +1 s signal poll
    assert pod["terminationGracePeriodSeconds"] > cfg.grace_seconds + 6
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    users = [a for w, a in docker.instr if w == "USER"]
    assert str(pod["securityContext"]["runAsUser"]) == users[-1].split(":")[0]
    res = k8s.container["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]


def test_images_agree(compose, k8s):
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    image = k8s.container["image"]
    name, _, tag = image.partition(":")
    for entry in kust.get("images", []):
        if entry["name"] == name:
            tag = entry.get("newTag", tag)
    assert f"{name}:{tag}" == compose["services"]["sapgrid"]["image"]


def test_every_sapgrid_env_var_in_deploy_is_a_config_field():
    """Anywhere in deploy/ (Dockerfile, manifests, README, scripts): SAPGRID_<FIELD> names a real field."""
    seen = set()
    for p in [*DEPLOY.rglob("*"), ROOT / ".dockerignore"]:
        if p.is_file():
            seen |= set(re.findall(r"\bSAPGRID_[A-Z0-9_]+\b", p.read_text()))
    assert seen
    assert not seen - CONFIG_ENV, f"not server config fields: {sorted(seen - CONFIG_ENV)}"


# ---------------------------------------------------------------------------------------------
# the image's helper scripts, against a real server
# ---------------------------------------------------------------------------------------------
def _run_healthcheck(*args, env=None):
    return subprocess.run([sys.executable, str(DEPLOY / "healthcheck.py"), *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_healthcheck_script(make_server):
    s = make_server(metrics_port=-1)
    ok = _run_healthcheck(s.address)
    assert ok.returncode == 0 and "SERVING" in ok.stdout, ok.stdout + ok.stderr
    assert _run_healthcheck(s.address, "sapgrid.v1.SapgridService").returncode == 0
    env = dict(os.environ, SAPGRID_LISTEN=f"0.0.0.0:{s.app.port}")
    assert _run_healthcheck(env=env).returncode == 0             # address from SAPGRID_LISTEN
    s.app.health.enter_graceful_shutdown()
    down = _run_healthcheck(s.address)
    assert down.returncode == 1 and "NOT_SERVING" in down.stdout
    s.stop()
    gone = _run_healthcheck(s.address)
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stdout


def test_warm_cache_script_loads_the_servers_kernels_and_fails_when_they_fail(monkeypatch, capsys):
    """The image's build step: the kernels a server loads as it starts (``sapgrid.server.kernels``), in a
    fresh process, into the cache the installed sapcore reads; exit 1 when the load fails."""
    import sapcore

    out = subprocess.run([sys.executable, str(DEPLOY / "warm_cache.py")], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"warm_cache: kernels of {sapcore.__file__} compiled and cached in" in out.stdout
    assert "kernels of 2D worlds loaded" in out.stderr and "kernels of 3D worlds loaded" in out.stderr
    spec = importlib.util.spec_from_file_location("warm_cache", DEPLOY / "warm_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod.kernels, "wait_all", lambda timeout=None: False)
    assert mod.main() == 1
    assert "loading the kernels failed" in capsys.readouterr().err


def test_compose_keeps_worlds_on_volumes(docker, compose):
    """The compose stacks give each server a data directory on a named volume (worlds survive a restart),
    and the image makes that directory for its runtime user (a fresh named volume copies its owner)."""
    svc = compose["services"]["sapgrid"]
    cfg = image_config(docker, compose_env(svc))
    mounts = dict(v.split(":")[::-1][:2] for v in svc["volumes"])      # container path -> volume
    assert cfg.data_dir in mounts and mounts[cfg.data_dir] in compose["volumes"]
    assert cfg.fsync in ("always", "everysec")
    runs = " ".join(a for w, a in docker.instr if w == "RUN")
    assert cfg.data_dir in runs and "-o 10001" in runs
    cluster = yaml.safe_load((DEPLOY / "compose.cluster.yaml").read_text())
    for name, s in cluster["services"].items():
        if name.startswith("sapgrid-"):
            env = {k: v for k, v in compose_env(s).items() if not k.startswith("SAPGRID_CLUSTER_")}  # a file in the container
            data_dir = image_config(docker, env).data_dir
            paths = [v.split(":")[1] for v in s["volumes"]]
            assert data_dir and any(data_dir == p or data_dir.startswith(p.rstrip("/") + "/") for p in paths), name
