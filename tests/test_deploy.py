"""The deployment files: the compose stack, its configs, the Dockerfile and the Grafana dashboards.

Docker is not needed: the compose file is checked against the compose specification, every file it
mounts must exist, the configs must point at each other (ports, hosts, data source uids), and every
PromQL expression of every dashboard may use only the metric names and labels of telemetry/names.py.
The metrics exposition itself goes through `promtool check metrics` (Debian package `prometheus`).
The stack runs two gateway replicas on one Redis behind nginx: here their configuration is checked
against each other and against deploy/nginx.conf; tests/e2e/test_load_balancer.py runs that nginx
configuration for real.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from ruamel.yaml import YAML

from gateway.apis.chat.answer import read_chat
from gateway.guardrails import Chains, GuardedCall, Guardrail, Guardrails, Verdict, deny
from gateway.instrumentation import RequestInfo, RequestRecord
from gateway.settings.model import Settings
from gateway.state.approvals import MemoryApprovals
from gateway.tools import Param, Tool, ToolCall, ToolExecutor, ToolOutcome, ToolRegistry, Turn
from gateway.tools.approval_gate import Approvals, Viewer
from gateway.tools.hooks import ClientResult
from gateway.tools.repair import RepairPolicy
from gateway.wire.headers import secret_names
from telemetry import names
from telemetry.instrument import Telemetry
from telemetry.metrics import Metrics
from telemetry.tracing import build_provider, exporters_for, tracer_of
from tests.conftest import every_outcome_registry
from tests.dashboards import DASHBOARD_DIR, all_panels, load_dashboard, panel_querying, row_members, shown

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DASHBOARDS = sorted(DASHBOARD_DIR.glob("*.json"))
PROVISIONING = DASHBOARD_DIR / "provisioning"
DEPLOY = ROOT / "deploy"
NGINX_CONF = DEPLOY / "nginx.conf"
REPLICAS = ("toolspan-1", "toolspan-2")
LOAD_BALANCER = "lb"
REDIS = "redis"

PROM_UID = "prometheus"
TEMPO_UID = "tempo"
TRACE_VARIABLE = "traces"  # the dashboards' trace data source, Tempo's provisioned uid by default
TRACES_REF = "${" + TRACE_VARIABLE + "}"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


# --- helpers -----------------------------------------------------------------------------------

def load_yaml(path: Path) -> Any:
    return YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))


def executable(name: str, install_hint: str) -> str:
    """A tool next to the interpreter (the venv's bin/), else on PATH; a missing tool fails the test,
    since CI installs every one of them."""
    sibling = Path(sys.executable).parent / name
    if sibling.is_file():
        return str(sibling)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: {install_hint}")
    return found


def promtool() -> str:
    return executable("promtool", "apt-get install -y --no-install-recommends prometheus")


def metric_constants() -> dict[str, str]:
    return {k: v for k, v in vars(names).items() if k.startswith("METRIC_")}


def label_constants() -> set[str]:
    return {v for k, v in vars(names).items() if k.startswith("LABEL_")}


def histogram_names() -> set[str]:
    """The METRIC_* names the real Metrics object registers as histograms (their series carry suffixes)."""
    families = Metrics(CollectorRegistry()).registry.collect()
    return {f.name for f in families if f.type == "histogram"}


def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE)
    assert isinstance(data, dict)
    return data


def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose()["services"]
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def interpolate(value: str, host_env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR-default}, as `docker compose` expands them."""
    def expand(match: re.Match[str]) -> str:
        name, op, default = match.group(1), match.group(2), match.group(3) or ""
        if name in host_env and (op != ":-" or host_env[name]):
            return host_env[name]
        return default if op else ""
    return re.sub(r"\$\{(\w+)(:-|-)?([^}]*)\}", expand, value)


def bind_mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(host source, container target) of every bind mount with a relative host path."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        elif volume.get("type") == "bind":
            source, target = volume["source"], volume["target"]
        else:
            continue
        if source.startswith("."):
            mounts.append((source, target))
    return mounts


def command_args(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(a) for a in command]


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def dockerfile_cmd() -> list[str]:
    [cmd] = [rest for keyword, rest in dockerfile_instructions() if keyword == "CMD"]
    parsed = json.loads(cmd)  # exec form, so the server gets the signals
    assert isinstance(parsed, list)
    return parsed


def dockerfile_env() -> dict[str, str]:
    """The image's ENV (KEY=value form)."""
    found: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                found[key] = value
    return found


def image_port() -> int:
    cmd = dockerfile_cmd()
    return int(cmd[cmd.index("--port") + 1])


def replica_services() -> dict[str, dict[str, Any]]:
    """The services that run the gateway image."""
    return {name: s for name, s in services().items() if s.get("image") == services()[REPLICAS[0]]["image"]}


def healthcheck_url(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL"), test
    urls: list[str] = re.findall(r"https?://[^'\" ]+", " ".join(test[1:]))
    assert len(urls) == 1, test
    return urls[0]


def nginx_config() -> str:
    """deploy/nginx.conf without its comment lines."""
    lines = NGINX_CONF.read_text(encoding="utf-8").splitlines()
    return "\n".join(line for line in lines if not line.lstrip().startswith("#"))


def nginx_upstreams() -> dict[str, list[str]]:
    """Each upstream block's `server` addresses."""
    return {name: re.findall(r"^\s*server\s+([^\s;]+)", body, re.M)
            for name, body in re.findall(r"\bupstream\s+(\w+)\s*\{([^}]*)\}", nginx_config())}


def nginx_directives(name: str) -> list[str]:
    """The arguments of every `name ...;` directive, in order."""
    return [" ".join(args.split()) for args in re.findall(rf"^\s*{name}\s+([^;]*);", nginx_config(), re.M)]


def nginx_seconds(value: str) -> float:
    """An nginx time (`600s`, `5m`, `500ms`, `60`) in seconds."""
    match = re.fullmatch(r"(\d+)(ms|s|m)?", value)
    assert match, f"{value!r} is not a time this test reads"
    return float(match.group(1)) * {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0}[match.group(2)]


# --- the compose file ----------------------------------------------------------------------------

def test_compose_file_validates_against_the_compose_specification() -> None:
    checker = executable("check-jsonschema", "pip install check-jsonschema (it is in the test extras)")
    run = subprocess.run([checker, "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_stack_has_every_service() -> None:
    assert set(services()) >= {*REPLICAS, LOAD_BALANCER, REDIS, "otel-collector", "tempo", "prometheus", "grafana"}
    assert set(replica_services()) == set(REPLICAS)


def test_every_bind_mount_and_the_build_context_exist() -> None:
    mounted = [(name, source) for name, service in services().items() for source, _ in bind_mounts(service)]
    assert mounted, "the stack mounts its configs from the repository"
    missing = [f"{name}: {source}" for name, source in mounted if not (ROOT / source).exists()]
    assert not missing, f"mounted but absent: {missing}"

    builds = [service["build"] for service in services().values() if "build" in service]
    assert builds
    for build in builds:
        context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert context.is_dir()
        assert (context / dockerfile).is_file()


def test_every_config_a_command_names_is_mounted() -> None:
    for name, service in services().items():
        targets = {target for _, target in bind_mounts(service)}
        for arg in command_args(service):
            flag, sep, value = arg.partition("=")
            if sep and "config" in flag and value.startswith("/"):
                assert value in targets, f"{name}: {arg} names a file that no volume mounts"


def test_ports_are_published_on_localhost_only() -> None:
    published = []
    for name, service in services().items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                assert port.get("host_ip") == "127.0.0.1", f"{name}: {port}"
            else:
                assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is reachable from other machines"
            published.append(name)
    assert {LOAD_BALANCER, "grafana", "prometheus"} <= set(published)
    # Clients reach the replicas through the load balancer only; Redis holds conversations: unpublished.
    assert not {*REPLICAS, REDIS} & set(published)


def test_images_are_pinned() -> None:
    for name, service in services().items():
        if "build" in service:
            continue
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository, f"{name}: {image} has no tag"
        assert "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image} is not pinned"
        assert re.match(r"v?\d+\.\d+\.\d+(-|$)", tag), f"{name}: {image} is not pinned to a release"


def test_prometheus_stores_exemplars() -> None:
    features = [a.partition("=")[2] for a in command_args(services()["prometheus"])
                if a.startswith("--enable-feature=")]
    assert "exemplar-storage" in ",".join(features).split(",")


def test_grafana_allows_anonymous_admin_for_local_use() -> None:
    env = environment(services()["grafana"])
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Admin"


# --- the gateway container ------------------------------------------------------------------------

@pytest.fixture(params=REPLICAS)
def compose_settings(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a replica's container starts with (the image's ENV, then the compose file's)
    when the host sets neither variable."""
    for var in [v for v in os.environ if v.startswith(("TOOLSPAN_", "OTEL_", "XDG_"))]:
        monkeypatch.delenv(var)
    for key, value in {**dockerfile_env(), **environment(services()[request.param])}.items():
        monkeypatch.setenv(key, interpolate(value, host_env={}))
    return Settings()


def test_an_unset_upstream_means_the_built_in_model(compose_settings: Settings) -> None:
    assert compose_settings.upstream is None
    assert compose_settings.upstream_api_key is None


def test_the_upstream_comes_from_the_host_environment() -> None:
    env = environment(services()[REPLICAS[0]])
    host = {"TOOLSPAN_UPSTREAM": "https://api.example.com/v1", "TOOLSPAN_UPSTREAM_API_KEY": "sk-test"}
    assert interpolate(env["TOOLSPAN_UPSTREAM"], host) == "https://api.example.com/v1"
    assert interpolate(env["TOOLSPAN_UPSTREAM_API_KEY"], host) == "sk-test"


def test_the_gateway_exports_traces_to_the_collector(compose_settings: Settings) -> None:
    assert compose_settings.otel_service_name == "toolspan"
    endpoint = urlsplit(compose_settings.otel_exporter_otlp_endpoint or "")
    assert endpoint.hostname in services()
    collector = load_yaml(DEPLOY / "otel-collector.yaml")
    assert endpoint.port == port_of(collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"])
    [exporter] = exporters_for(compose_settings.otel_traces_exporter, compose_settings.otel_exporter_otlp_endpoint,
                               compose_settings.otel_exporter_otlp_traces_endpoint,
                               compose_settings.otel_exporter_otlp_protocol)
    assert type(exporter).__name__ == "OTLPSpanExporter"


def test_the_image_serves_on_the_port_prometheus_scrapes() -> None:
    cmd = dockerfile_cmd()
    assert cmd[:2] == ["toolspan", "serve"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"  # inside the container; compose publishes on localhost
    port = image_port()
    exposed = [int(p.split("/")[0]) for keyword, rest in dockerfile_instructions() if keyword == "EXPOSE"
               for p in rest.split()]
    assert port in exposed
    for name in REPLICAS:
        assert port in [int(str(p).split("/")[0]) for p in services()[name].get("expose", [])], name

    # Each replica directly (a scrape through the load balancer would reach either), one instance each.
    prometheus = load_yaml(DEPLOY / "prometheus.yml")
    [job] = [j for j in prometheus["scrape_configs"] if j["job_name"] == "toolspan"]
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets == [f"{name}:{port}" for name in REPLICAS]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert not job.get("relabel_configs"), "the instance label stays the target, one per replica"
    assert set(services()["prometheus"]["depends_on"]) >= set(REPLICAS)


# --- the replicas, Redis and the load balancer -----------------------------------------------------

def test_the_replicas_share_one_configuration() -> None:
    first, *others = (services()[name] for name in REPLICAS)
    assert others
    for other in others:
        assert {k: v for k, v in other.items() if k != "volumes"} == {k: v for k, v in first.items() if k != "volumes"}


def test_the_replicas_share_state_in_the_redis_service(compose_settings: Settings) -> None:
    assert compose_settings.state_url is not None
    url = urlsplit(compose_settings.state_url)
    assert (url.scheme, url.hostname, url.port) == ("redis", REDIS, 6379)
    redis = services()[REDIS]
    args = command_args(redis)
    assert args[0] == "redis-server"
    assert "--port" not in args  # so it listens on 6379, Redis's default
    # Nothing written to disk: held turns live minutes, and the gateway says 409 for one lost.
    assert args[args.index("--save") + 1] == ""
    assert args[args.index("--appendonly") + 1] == "no"
    assert not redis.get("volumes")
    for name in REPLICAS:
        assert services()[name]["depends_on"][REDIS] == {"condition": "service_healthy"}


def test_each_replica_keeps_its_trajectory_store_on_a_volume_of_its_own(compose_settings: Settings) -> None:
    directory = str(compose_settings.store_path().parent)
    assert compose_settings.store_path().is_absolute()
    volumes = []
    for name in REPLICAS:
        mounted = [str(v).split(":") for v in services()[name]["volumes"]]
        [source] = [source for source, target, *_ in mounted if target == directory]
        assert not source.startswith((".", "/")), f"{name}: {source} is a bind mount, not a named volume"
        volumes.append(source)
    assert len(set(volumes)) == len(REPLICAS), "the replicas share a trajectory store"
    assert set(volumes) <= set(compose().get("volumes") or {})
    # The image makes the directory its user's, so a fresh named volume takes that owner.
    runs = " ".join(rest for keyword, rest in dockerfile_instructions() if keyword == "RUN")
    assert re.search(rf"install -d -o toolspan -g toolspan( -m \d+)? {re.escape(directory)}\b", runs), runs


def test_the_load_balancer_sends_to_both_replicas() -> None:
    port = image_port()
    upstreams = nginx_upstreams()
    assert upstreams
    for name, servers in upstreams.items():
        assert servers == [f"{replica}:{port}" for replica in REPLICAS], name
    for target in nginx_directives("proxy_pass"):
        assert urlsplit(target).hostname in upstreams, f"proxy_pass {target} names no upstream block"
    lb = services()[LOAD_BALANCER]
    assert set(lb["depends_on"]) == set(REPLICAS)
    assert lb["image"].startswith("nginx:")
    mounts = {target: source for source, target in bind_mounts(lb)}
    assert (ROOT / mounts["/etc/nginx/nginx.conf"]).resolve() == NGINX_CONF
    args = command_args(lb)
    assert args[args.index("-c") + 1] == "/etc/nginx/nginx.conf"
    # The scratch directories the config names relative to nginx's prefix are the image's.
    assert args[args.index("-p") + 1] == "/var/cache/nginx/"
    for directive in ("client_body_temp_path", "proxy_temp_path"):
        [path] = nginx_directives(directive)
        assert not path.startswith("/"), f"{directive} {path}: relative to the prefix"
    # Clients keep the gateway's address: 127.0.0.1:8080 is nginx's listen port.
    [listen] = nginx_directives("listen")
    published = [str(p).split(":") for p in lb["ports"]]
    assert ["127.0.0.1", "8080", listen] in published


def test_the_load_balancer_streams_waits_for_models_and_never_replays() -> None:
    settings = Settings()
    one = {name: nginx_directives(name) for name in (
        "proxy_buffering", "proxy_request_buffering", "proxy_http_version", "client_max_body_size",
        "proxy_read_timeout", "proxy_next_upstream", "proxy_intercept_errors")}
    assert one["proxy_buffering"] == ["off"]  # server-sent events, as they are written
    assert one["proxy_request_buffering"] == ["off"]  # bodies go on as they arrive; the gateway limits them
    assert one["client_max_body_size"] == ["0"]  # the gateway's 413, in the OpenAI shape, per route
    assert one["proxy_http_version"] == ["1.1"]
    assert 'Connection ""' in nginx_directives("proxy_set_header")  # keep-alive to the replicas
    [read_timeout] = one["proxy_read_timeout"]
    assert nginx_seconds(read_timeout) >= 2 * settings.upstream_timeout_seconds
    # Only connection failures go to another replica; 5xx answers and POSTs are never replayed.
    assert one["proxy_next_upstream"] == ["error timeout"]
    assert one["proxy_intercept_errors"] in ([], ["off"])  # the replicas' error bodies pass as they are
    for timeout in nginx_directives("keepalive_timeout"):  # nginx, not the replica, closes idle connections
        assert nginx_seconds(timeout) < settings.header_read_timeout_seconds
    assert nginx_directives("keepalive")


def test_the_gateway_redis_and_the_load_balancer_have_healthchecks() -> None:
    port = image_port()
    for name in REPLICAS:
        url = urlsplit(healthcheck_url(services()[name]))
        assert (url.hostname, url.port, url.path) == ("127.0.0.1", port, "/healthz")
    [listen] = nginx_directives("listen")
    url = urlsplit(healthcheck_url(services()[LOAD_BALANCER]))
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", int(listen), "/healthz")
    assert services()[REDIS]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_the_image_runs_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    [base] = [rest for keyword, rest in instructions if keyword == "FROM"]
    assert base.startswith("python:3.11-slim")
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users
    assert users[-1].split(":")[0] not in ("root", "0")


def test_every_file_the_dockerfile_copies_exists() -> None:
    for keyword, rest in dockerfile_instructions():
        if keyword in ("COPY", "ADD"):
            *sources, _ = [w for w in rest.split() if not w.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), f"{keyword} {rest}: {source} is not in the build context"


# --- the collector, Tempo, Prometheus ---------------------------------------------------------------

def test_the_collector_sends_traces_to_tempo() -> None:
    collector = load_yaml(DEPLOY / "otel-collector.yaml")
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert port_of(protocols["grpc"]["endpoint"]) == 4317
    assert port_of(protocols["http"]["endpoint"]) == 4318
    pipeline = collector["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        for component in pipeline[kind]:
            assert component in collector[kind], f"pipeline uses {kind} {component}, which is not defined"
    assert "batch" in pipeline["processors"]
    [exporter] = pipeline["exporters"]
    assert exporter.split("/")[0] == "otlp"
    config = collector["exporters"][exporter]
    host, port = config["endpoint"].rsplit(":", 1)
    assert host == "tempo"
    assert host in services()
    assert config["tls"]["insecure"] is True
    tempo = load_yaml(DEPLOY / "tempo.yaml")
    assert int(port) == port_of(tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    assert tempo["storage"]["trace"]["backend"] == "local"


def test_prometheus_config_passes_promtool() -> None:
    run = subprocess.run([promtool(), "check", "config", str(DEPLOY / "prometheus.yml")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


# --- Grafana provisioning --------------------------------------------------------------------------

def test_datasources_link_exemplars_to_tempo() -> None:
    provisioned = load_yaml(PROVISIONING / "datasources" / "datasources.yaml")
    by_uid = {d["uid"]: d for d in provisioned["datasources"]}
    prometheus, tempo = by_uid[PROM_UID], by_uid[TEMPO_UID]
    assert prometheus["type"] == "prometheus"
    assert tempo["type"] == "tempo"
    [destination] = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert destination["name"] == names.EXEMPLAR_TRACE_ID  # the exemplar label the histograms carry
    assert destination["datasourceUid"] == TEMPO_UID
    assert urlsplit(prometheus["url"]).hostname == "prometheus"
    tempo_config = load_yaml(DEPLOY / "tempo.yaml")
    assert urlsplit(tempo["url"]).hostname == "tempo"
    assert urlsplit(tempo["url"]).port == tempo_config["server"]["http_listen_port"]
    scrape = load_yaml(DEPLOY / "prometheus.yml")["global"]["scrape_interval"]
    assert prometheus["jsonData"]["timeInterval"] == scrape  # $__rate_interval is derived from it


def test_dashboard_provider_reads_the_mounted_dashboards() -> None:
    provider = load_yaml(PROVISIONING / "dashboards" / "toolspan.yaml")
    [entry] = provider["providers"]
    assert entry["type"] == "file"
    grafana = dict((target, source) for source, target in bind_mounts(services()["grafana"]))
    source = grafana[entry["options"]["path"]]
    assert (ROOT / source).resolve() == DASHBOARD_DIR
    assert (ROOT / grafana["/etc/grafana/provisioning/dashboards"]).resolve() == PROVISIONING / "dashboards"
    assert (ROOT / grafana["/etc/grafana/provisioning/datasources"]).resolve() == PROVISIONING / "datasources"


# --- dashboards ------------------------------------------------------------------------------------

def query_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in all_panels(dashboard) if p.get("type") != "row"]


def prom_expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in query_panels(dashboard) for t in p.get("targets", []) if "expr" in t]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            exprs.append(query if isinstance(query, str) else query["query"])
    return exprs


_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\(\s*([^,)]+)\s*,\s*(\w+)\s*\)")
_BOUNDED_VALUES = {
    names.LABEL_OUTCOME: set(names.OUTCOMES),
    names.LABEL_KIND: set(names.RETRY_KINDS),
    names.LABEL_REASON: set(names.REJECTION_REASONS),
    names.LABEL_TYPE: {names.TOKEN_INPUT, names.TOKEN_OUTPUT},
}


def metrics_of(expr: str) -> set[str]:
    """Metric names after stripping the series suffix of histograms; a suffix-less histogram name
    or a suffixed non-histogram is returned as is, so it fails the lookup."""
    histograms = histogram_names()
    found = set()
    for series in re.findall(r"\btoolspan_[a-z_]+", expr):
        for suffix in HISTOGRAM_SUFFIXES:
            if series.endswith(suffix) and series[: -len(suffix)] in histograms:
                series = series[: -len(suffix)]
                break
        else:
            if series in histograms:
                series += " (a histogram: query its _bucket, _sum or _count series)"
        found.add(series)
    return found


def labels_of(expr: str) -> set[str]:
    labels = {m.group(1) for block in re.findall(r"\{([^{}]*)\}", expr) for m in _MATCHER.finditer(block)}
    labels |= {name.strip() for group in _GROUPING.findall(expr) for name in group.split(",") if name.strip()}
    labels |= {m.group(2) for m in _LABEL_VALUES.finditer(expr)}
    return labels


def literal_values(expr: str) -> Iterator[tuple[str, str]]:
    """(label, value) for every equality matcher, and every alternative of a plain regex matcher."""
    for block in re.findall(r"\{([^{}]*)\}", expr):
        for match in _MATCHER.finditer(block):
            label, op, value = match.groups()
            if value.startswith("$"):
                continue  # a dashboard variable
            if op in ("=", "!="):
                yield label, value
            elif re.fullmatch(r"[\w|]+", value):
                for alternative in value.split("|"):
                    yield label, alternative


@pytest.fixture(params=DASHBOARDS, ids=lambda p: p.name)
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_dashboard(request.param)


def test_there_are_an_overview_and_a_tools_dashboard() -> None:
    assert {p.name for p in DASHBOARDS} >= {"overview.json", "tools.json"}
    uids = [load_dashboard(p)["uid"] for p in DASHBOARDS]
    assert all(uids)
    assert len(set(uids)) == len(uids)


def test_dashboard_is_well_formed(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"]
    assert dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in all_panels(dashboard)]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {dashboard['uid']}"
    panels = query_panels(dashboard)
    assert panels
    for panel in panels:
        assert panel["title"].strip(), panel
        assert panel.get("description", "").strip(), f"{panel['title']}: say which question the panel answers"
        assert panel["targets"], panel["title"]
        panel_uid = panel.get("datasource", {}).get("uid")
        for target in panel["targets"]:
            assert target.get("datasource", {}).get("uid") in (PROM_UID, TRACES_REF), (panel["title"], target)
            assert panel_uid in (None, target["datasource"]["uid"]), f"{panel['title']}: panel and query disagree"
            assert target.get("refId")
            query_key = "expr" if target["datasource"]["uid"] == PROM_UID else "query"
            assert target.get(query_key, "").strip(), (panel["title"], target)


def test_duration_panels_show_exemplars(dashboard: dict[str, Any]) -> None:
    duration_panels = 0
    for panel in query_panels(dashboard):
        by_title = re.search(r"duration|latency", panel["title"], re.IGNORECASE) is not None
        for target in panel["targets"]:
            by_series = re.search(r"_duration_seconds_bucket", target.get("expr", "")) is not None
            if by_title or by_series:
                duration_panels += 1
                assert target.get("exemplar") is True, f"{panel['title']}: {target['refId']} hides exemplars"
                assert panel["type"] == "timeseries", f"{panel['title']}: exemplars show on time series only"
    assert duration_panels, f"{dashboard['uid']} has no duration panel"


def test_dashboards_query_only_defined_metrics(dashboard: dict[str, Any]) -> None:
    defined = set(metric_constants().values())
    exprs = prom_expressions(dashboard)
    assert exprs
    for expr in exprs:
        used = metrics_of(expr)
        assert used, f"no toolspan metric in {expr!r}"
        assert used <= defined, f"{expr!r} uses {sorted(used - defined)}, not in telemetry/names.py"


def test_dashboards_use_only_defined_labels(dashboard: dict[str, Any]) -> None:
    allowed = label_constants() | {"le"}
    for expr in prom_expressions(dashboard):
        unknown = labels_of(expr) - allowed
        assert not unknown, f"{expr!r} uses labels {sorted(unknown)}, not in telemetry/names.py"
        for label, value in literal_values(expr):
            if label in _BOUNDED_VALUES:
                assert value in _BOUNDED_VALUES[label], f"{expr!r}: {label}={value!r} never occurs"
            if label == names.LABEL_TOOL:
                assert value == names.UNKNOWN_TOOL, f"{expr!r}: a dashboard names no particular tool"


def test_rate_windows_follow_the_scrape_interval(dashboard: dict[str, Any]) -> None:
    for expr in prom_expressions(dashboard):
        windows = re.findall(r"\[([^\]]*)\]", expr)
        assert all(w == "$__rate_interval" for w in windows), f"{expr!r}: use [$__rate_interval]"
        if re.search(r"\b(?:rate|increase|irate)\(", expr):
            assert windows, expr


def test_dashboard_variables_are_defined(dashboard: dict[str, Any]) -> None:
    defined = {v["name"] for v in dashboard.get("templating", {}).get("list", [])}
    builtin = {"__rate_interval", "__interval", "__range"}
    for expr in prom_expressions(dashboard):
        for used in re.findall(r"\$\{?(\w+)", expr):
            assert used in defined | builtin, f"{expr!r} uses ${used}, which the dashboard does not define"


def test_trace_panels_query_defined_spans_and_attributes(dashboard: dict[str, Any]) -> None:
    span_names = {v for k, v in vars(names).items() if k.startswith("SPAN_")}
    attributes = {v for k, v in vars(names).items() if k.startswith("ATTR_")}
    for panel in query_panels(dashboard):
        for target in panel["targets"]:
            if target["datasource"]["uid"] != TRACES_REF:
                continue
            query = target["query"]
            for name in re.findall(r'\bname\s*=\s*"([^"]+)"', query):
                assert name in span_names, f"{query!r}: no span is named {name!r}"
            for attribute in re.findall(r"\bspan\.([\w.]+)", query):
                assert attribute in attributes, f"{query!r}: no attribute {attribute!r} in telemetry/names.py"
            for value in re.findall(r'span\.toolspan\.outcome\s*=~?\s*"([^"]+)"', query):
                assert set(value.split("|")) <= set(names.OUTCOMES), query


def exemplar_destination() -> dict[str, Any]:
    provisioned = load_yaml(PROVISIONING / "datasources" / "datasources.yaml")
    [prometheus] = [d for d in provisioned["datasources"] if d["uid"] == PROM_UID]
    [destination] = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert isinstance(destination, dict)
    return destination


def test_trace_queries_go_to_the_trace_data_source_the_dashboard_names() -> None:
    """Every trace query goes to the data source of the dashboard's `traces` variable (a Grafana
    whose Tempo has another uid, or several, picks it there), by default the provisioned Tempo,
    where exemplar links lead too. No trace panel names a data source itself."""
    traced = 0
    for path in DASHBOARDS:
        assert f'"uid": "{TEMPO_UID}"' not in path.read_text(encoding="utf-8"), f"{path.name} names Tempo's uid"
        dashboard = load_dashboard(path)
        variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
        for panel in query_panels(dashboard):
            for target in (t for t in panel["targets"] if t["datasource"]["type"] != "prometheus"):
                traced += 1
                assert panel["datasource"]["uid"] == target["datasource"]["uid"] == TRACES_REF, panel["title"]
                variable = variables[TRACE_VARIABLE]
                assert variable["type"] == "datasource"
                assert variable["query"] == target["datasource"]["type"] == "tempo"  # TraceQL is Tempo's
                assert variable["current"]["value"] == exemplar_destination()["datasourceUid"] == TEMPO_UID
                if target.get("queryType") == "traceql":
                    assert "Tempo only" in panel["description"], f"{panel['title']}: say that it needs Tempo"
    assert traced, "no dashboard shows traces"


def test_exemplar_links_are_called_what_the_panels_say() -> None:
    """Grafana takes an exemplar's trace link from the Prometheus data source, not from the dashboard:
    the panels quote the label provisioned there, and that label names no trace backend, as the
    destination can be any trace data source (docs/telemetry-and-trajectories.md)."""
    label = exemplar_destination()["urlDisplayLabel"]
    assert "tempo" not in label.lower()
    quoted = 0
    for path in DASHBOARDS:
        for panel in query_panels(load_dashboard(path)):
            for said in re.findall(r'"(Open trace[^"]*)"', panel.get("description", "")):
                quoted += 1
                assert said == label, f"{panel['title']}: the link is called {label!r}"
    assert quoted


# Each row's topic: the metrics its panels may show (a row of none shows traces).
ROW_TOPICS: dict[str, dict[str, set[str]]] = {
    "toolspan-overview": {
        "Is the gateway healthy?": {names.METRIC_REQUESTS, names.METRIC_REQUESTS_IN_FLIGHT, names.METRIC_TOOL_ROUNDS},
        "Traffic and errors": {names.METRIC_REQUESTS, names.METRIC_UPSTREAM_REQUESTS,
                               names.METRIC_REQUESTS_IN_FLIGHT},
        "Latency": {names.METRIC_REQUEST_DURATION, names.METRIC_UPSTREAM_DURATION},
        "Provider": {names.METRIC_UPSTREAM_REQUESTS, names.METRIC_UPSTREAM_RETRIES, names.METRIC_TOKENS},
        "Upstreams": {names.METRIC_UPSTREAM_REQUESTS, names.METRIC_UPSTREAM_FALLBACKS, names.METRIC_UPSTREAM_UP,
                      names.METRIC_UPSTREAM_DURATION, names.METRIC_TRANSLATED_CALLS},
        "Agent loop": {names.METRIC_TOOL_ROUNDS},
        "Limits": {names.METRIC_LIMIT_REFUSALS, names.METRIC_LIMITS_UNAVAILABLE, names.METRIC_LIMIT_USAGE,
                   names.METRIC_LIMIT_BOUND},
    },
    "toolspan-tools": {
        "Outcomes": {names.METRIC_TOOL_CALLS, names.METRIC_TOOL_REJECTIONS},
        "Duration": {names.METRIC_TOOL_CALL_DURATION, names.METRIC_CLIENT_TOOL_ROUNDTRIP},
        "Retries and recovery": {names.METRIC_TOOL_RETRIES, names.METRIC_TOOL_RECOVERIES,
                                 names.METRIC_TOOL_ALIASES_USED, names.METRIC_TOOL_REPAIRS},
        "Timeouts, unknown tools and unchecked calls": {names.METRIC_TOOL_CALLS, names.METRIC_TOOL_REJECTIONS,
                                                        names.METRIC_TOOL_UNCHECKED},
        "Traces": set(),
        "MCP servers": {names.METRIC_MCP_SERVER_UP, names.METRIC_MCP_SERVER_DISCONNECTS},
        "Stores: trajectories and shared state": {
            names.METRIC_TRAJECTORY_STORE_DROPPED, names.METRIC_STATE_STORE_UP, names.METRIC_STATE_STORE_FAILURES,
            names.METRIC_STATE_STORE_LOSSES, names.METRIC_STATE_STORE_UNREADABLE, names.METRIC_HELD_TURNS_LOST},
        "Approvals": {names.METRIC_APPROVAL_DECISIONS, names.METRIC_APPROVALS_PENDING, names.METRIC_APPROVAL_WAIT},
        "Guardrails": {names.METRIC_GUARDRAIL_DECISIONS, names.METRIC_GUARDRAIL_FAILURES},
    },
}


def test_each_row_holds_only_the_panels_of_its_topic(dashboard: dict[str, Any]) -> None:
    topics = ROW_TOPICS[dashboard["uid"]]
    members = row_members(dashboard)
    assert list(members) == list(topics), "every panel sits under a row; the rows, in this order"
    for row, panels in members.items():
        assert panels, f"the row {row!r} is empty"
        for panel in panels:
            shows = set().union(*(metrics_of(t["expr"]) for t in panel["targets"] if "expr" in t))
            assert shows <= topics[row], f"{panel['title']!r} (on {sorted(shows - topics[row])}) is under {row!r}"
            if not topics[row]:
                assert {t["datasource"]["uid"] for t in panel["targets"]} == {TRACES_REF}, panel["title"]


def test_panels_are_listed_in_grid_order_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    placed = [p["gridPos"] for p in dashboard["panels"]]
    assert [(g["y"], g["x"]) for g in placed] == sorted((g["y"], g["x"]) for g in placed)
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for cell in ((x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                     for y in range(grid["y"], grid["y"] + grid["h"])):
            assert cell not in taken, f"{panel['title']!r} overlaps {taken[cell]!r}"
            taken[cell] = panel["title"]


def test_the_state_store_panel_tells_not_configured_from_reachable() -> None:
    """The gateway exports toolspan_state_store_up only with a shared state store (Redis): its
    absence reads "not configured", never "reachable" (tests/e2e/test_prometheus.py scrapes both)."""
    panel = panel_querying(load_dashboard(DASHBOARD_DIR / "tools.json"), f"min({names.METRIC_STATE_STORE_UP})")
    assert panel["type"] == "stat"
    [target] = panel["targets"]
    assert target["instant"] is True  # the state now: a gauge gone since is not shown from before
    assert shown(panel, None) == "not configured"
    assert shown(panel, 1) == "reachable"
    assert shown(panel, 0) == "unavailable"


def test_the_tools_dashboard_answers_the_operators_questions() -> None:
    tools = load_dashboard(DASHBOARD_DIR / "tools.json")
    exprs = " ".join(prom_expressions(tools))
    for metric in (names.METRIC_TOOL_CALLS, names.METRIC_TOOL_CALL_DURATION, names.METRIC_TOOL_REJECTIONS,
                   names.METRIC_TOOL_RETRIES, names.METRIC_TOOL_RECOVERIES):
        assert metric in exprs, f"the tools dashboard does not show {metric}"
    assert 'outcome="timeout"' in exprs
    assert f'tool="{names.UNKNOWN_TOOL}"' in exprs
    overview = " ".join(prom_expressions(load_dashboard(DASHBOARD_DIR / "overview.json")))
    for metric in (names.METRIC_REQUESTS, names.METRIC_REQUEST_DURATION, names.METRIC_UPSTREAM_DURATION,
                   names.METRIC_UPSTREAM_REQUESTS, names.METRIC_TOKENS, names.METRIC_TOOL_ROUNDS,
                   names.METRIC_REQUESTS_IN_FLIGHT):
        assert metric in overview, f"the overview dashboard does not show {metric}"


def test_every_metric_appears_on_some_dashboard() -> None:
    shown = set().union(*(metrics_of(e) for p in DASHBOARDS for e in prom_expressions(load_dashboard(p))))
    assert set(metric_constants().values()) <= shown


# --- the exposition -----------------------------------------------------------------------------------

async def _drive(registry: CollectorRegistry) -> None:
    """Every outcome, every rejection reason, both retry kinds and a recovery, inside one request
    with one provider call, so every metric family has samples."""
    metrics = Metrics(registry)
    metrics.state_store_shared()  # as on Redis: the only way to have that gauge
    instrumentation = Telemetry(tracer_of(build_provider()), metrics)
    executor = ToolExecutor(every_outcome_registry(), instrumentation)
    turn = Turn(trajectory_id="traj-deploy", request_id="req-1")
    calls = [
        ("read_file", '{"file_path": "a"}', None),  # missing_arguments
        ("read_file", '{"path": "a"}', None),  # corrected retry, recovered
        ("read_file", '{"path": ', None),  # invalid_json
        ("strict", '{"path": "a"}', None),  # parser
        ("checked", '{"n": "many"}', None),  # schema_violation
        ("locked", "{}", None),  # error
        ("locked", "{}", None),  # verbatim retry
        ("slow", "{}", None),  # timeout
        ("review", "{}", None),  # interrupted
        ("no_such_tool", "{}", None),  # unknown_tool
        ("admin", "{}", ["read_file"]),  # not_allowed
    ]
    info = RequestInfo("POST", "/v1/chat/completions", "/v1/chat/completions", {}, "traj-deploy")
    with instrumentation.request(info) as request:
        with instrumentation.chat("gpt-test", False, "default", "openai") as chat:
            chat.answered(read_chat({"id": "chatcmpl-1", "model": "gpt-test",
                                     "choices": [{"message": {}, "finish_reason": "tool_calls"}],
                                     "usage": {"prompt_tokens": 12, "completion_tokens": 5}}))
        # a provider call the gateway retried
        with instrumentation.chat("gpt-test", False, "west", "openai") as chat:
            chat.fell_back("east", "429")  # the upstream tried first answered 429
            chat.translated("messages->chat", ("top_k",))  # a Messages client on a Chat upstream
            chat.retried(2)
            chat.answered(read_chat({"id": "chatcmpl-2", "model": "gpt-test",
                                     "choices": [{"message": {}, "finish_reason": "stop"}]}))
        for index, (name, arguments, allowed) in enumerate(calls):
            await executor.run_turn([ToolCall(f"call_{index}", name, arguments)], turn, allowed)
        # A call of the client's own tool that the gateway could not check (a tool of no schema).
        async with instrumentation.tool_call(ToolCall("call_c", "grammar", "SELECT 1"), None, turn,
                                             side="client") as checked:
            checked.finish(ToolOutcome("call_c", "grammar", "unchecked", "", unchecked="not_a_function"))
        instrumentation.client_result(ClientResult("call_c", "grammar", time.time() - 1.5, 2, error=False), turn)
        await _denied(instrumentation, turn)  # a call a reviewer refused
        await _guarded(instrumentation, turn)  # a call a guardrail denied, a result a failed guardrail withheld
        await _mended(instrumentation, turn)  # an alias used; a repair applied (outcome repaired), one observed
        request.finish(200, RequestRecord(rounds=2, held_turn_lost=True))  # it continued a forgotten turn
    instrumentation.upstream_state("east", False)  # an upstream cooling down
    instrumentation.limit_usage("alice", "requests_per_minute", 60, 60)  # a key at its limit, refused
    instrumentation.limit_refused("alice", "requests_per_minute")
    instrumentation.limits_unavailable()  # a check let through while Redis was down
    instrumentation.mcp_server_state("files", True, disconnected=False)  # an MCP server up, then lost
    instrumentation.mcp_server_state("files", False, disconnected=True)


async def _denied(instrumentation: Telemetry, turn: Turn) -> None:
    """One call of a tool that needs approval, denied by a reviewer while it waits."""
    approvals = Approvals(MemoryApprovals(), 5.0, secret_names(()))
    gated = ToolExecutor(ToolRegistry([Tool(name="pay", function=lambda args: "paid", approval=True)]),
                         instrumentation, gate=approvals)
    everyone = Viewer(None, sees_all=True, may_decide=True)

    async def reviewer() -> None:
        while True:
            changed = approvals.next_change()
            if listed := await approvals.pending(everyone):
                await approvals.decide(listed[0]["id"], everyone, "deny", reason="no")
                return
            await changed.wait()

    await asyncio.gather(gated.run_turn([ToolCall("call_p", "pay", "{}")], turn), reviewer())


class _NoProduction(Guardrail):
    name = "no_production"

    def before_execute(self, call: GuardedCall) -> Verdict | None:
        return deny("production is off limits") if call.arguments.get("host") == "prod" else None

    def after_execute(self, call: GuardedCall, result: str) -> Verdict | None:
        raise ValueError("a guardrail with a bug")


async def _guarded(instrumentation: Telemetry, turn: Turn) -> None:
    """A call a guardrail denies, and one whose guardrail raises on its result (withheld)."""
    guarded = ToolExecutor(ToolRegistry([Tool(name="deploy", function=lambda args: "deployed")]), instrumentation,
                           guardrails=Guardrails(Chains(), gateway=[_NoProduction()]))
    for host in ("prod", "staging"):
        await guarded.run_turn([ToolCall(f"call_{host}", "deploy", json.dumps({"host": host}))], turn)


async def _mended(instrumentation: Telemetry, turn: Turn) -> None:
    """A call through a parameter alias, one whose arguments repair fixed and ran, and one whose fix
    it only recorded (its tool's mode observe)."""
    parameters = [Param("a", "integer", required=True, aliases=["first"]), Param("b", "integer", required=True)]
    registry = ToolRegistry([Tool(name="total", function=lambda args: args["a"] + args["b"], parameters=parameters,
                                  validate_schema=True),
                             Tool(name="peek", function=lambda args: "seen", argument_repair="observe",
                                  parameters=[Param("n", "integer", required=True)], validate_schema=True)])
    mended = ToolExecutor(registry, instrumentation, repair=RepairPolicy("apply"))
    for index, (name, arguments) in enumerate((("total", {"first": 1, "b": 2}), ("total", {"a": "1", "b": 2}),
                                               ("peek", {"n": "3"}))):
        await mended.run_turn([ToolCall(f"call_m{index}", name, json.dumps(arguments))], turn)
    await mended.aclose()


def classic_exposition() -> tuple[CollectorRegistry, bytes]:
    registry = CollectorRegistry()
    asyncio.run(_drive(registry))
    return registry, generate_latest(registry)


def test_every_metric_family_has_samples_after_a_session() -> None:
    registry, _ = classic_exposition()
    samples = {s.name: s for family in registry.collect() for s in family.samples}
    histograms = histogram_names()
    for metric in metric_constants().values():
        series = metric + "_count" if metric in histograms else metric
        assert series in samples, f"{metric} has no sample"
    for label, values in ((names.LABEL_OUTCOME, set(names.OUTCOMES) - {"cancelled"}),
                          (names.LABEL_REASON, set(names.REJECTION_REASONS)),
                          (names.LABEL_KIND, set(names.RETRY_KINDS))):
        seen = {s.labels.get(label) for family in registry.collect() for s in family.samples}
        assert values <= seen, f"{label}: {sorted(values - seen)} never produced"


def test_classic_exposition_passes_promtool_check_metrics() -> None:
    _, exposition = classic_exposition()
    assert b"toolspan_tool_call_duration_seconds_bucket" in exposition
    run = subprocess.run([promtool(), "check", "metrics"], input=exposition, capture_output=True, timeout=60,
                         check=False)
    report = (run.stdout + run.stderr).decode()
    assert run.returncode == 0, report
    assert not report.strip(), report
