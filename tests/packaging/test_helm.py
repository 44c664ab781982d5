"""The Helm chart (packaging/helm/llmgw): rendered by Helm's own Go engine (the
helm-python-sdk wheel binds Helm 4's SDK; no cluster and no `helm` binary needed), linted
by Helm, and every manifest checked against the Kubernetes JSON schemas
(kubernetes-validate, which ships them: offline), for SQLite and PostgreSQL values.
The server.yaml the chart writes is read by llmgw's own config loader, and the init
step's command line, as the pod runs it, makes a data dir from it.

The two packages are in pyproject's test extra; until a venv has them these tests skip
and say which is missing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw.config import ServerConfig, build

helm = pytest.importorskip(
    "helm_python", reason="helm-python-sdk (Helm's engine, in the test extra) is not installed"
)
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate (in the test extra) is not installed"
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "packaging/helm/llmgw"
RELEASE, NAMESPACE = "demo", "llm"
# The oldest Kubernetes the chart is checked for, and the newest the validator knows.
KUBERNETES = ("1.28.0", kubernetes_validate.utils.latest_version())

Manifest = dict[str, Any]

POSTGRES = {
    "store": {"backend": "postgres", "dsn": {"existingSecret": "llmgw-db", "key": "uri"}},
    "secrets": {"existingSecret": "llmgw-keys"},
}
EVERYTHING = {
    "controlPlane": {
        "advertise": ["llmgw.example.com", "203.0.113.7"],
        "config": {"scheduling": {"strategy": "spread"}, "gateway": {"queue_wait": 60}},
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
    },
    "ingress": {
        "enabled": True,
        "className": "nginx",
        "tls": [{"secretName": "llmgw-tls", "hosts": ["llmgw.example.com"]}],
    },
    "serviceMonitor": {"enabled": True, "tokenSecret": {"name": "llmgw-metrics"}},
    "agents": {
        "enabled": True,
        "joinToken": {"existingSecret": "llmgw-join"},
        "runtimeClassName": "nvidia",
    },
}


def _merge(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = _merge(out[key], value)
            else:
                out[key] = value
    return out


def render(values: dict[str, Any]) -> list[Manifest]:
    with helm.Chart.load(str(CHART)) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    docs: list[Manifest] = []
    for name, text in sorted(files.items()):
        if name.endswith(".yaml"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def only(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def server_yaml(docs: list[Manifest]) -> dict[str, Any]:
    data = yaml.safe_load(only(docs, "ConfigMap")["data"]["server.yaml"])
    assert isinstance(data, dict)
    return data


def pod(docs: list[Manifest]) -> Manifest:
    spec: Manifest = only(docs, "StatefulSet")["spec"]["template"]["spec"]
    return spec


def container(docs: list[Manifest], name: str) -> Manifest:
    found: Manifest = next(c for c in pod(docs)["containers"] if c["name"] == name)
    return found


def test_helm_lints_the_chart_clean() -> None:
    report = helm.lint(str(CHART))
    assert report["errors"] == []
    # Helm's severities: 1 information, 2 warning, 3 error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    "values",
    [{}, POSTGRES, _merge(EVERYTHING), _merge(POSTGRES, EVERYTHING)],
    ids=["sqlite", "postgres", "sqlite-everything", "postgres-everything"],
)
def test_every_manifest_passes_the_kubernetes_schemas(values: dict[str, Any]) -> None:
    docs = render(values)
    assert docs
    checked = 0
    for doc in docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # a CRD's kind: test_service_monitor_scrapes_the_api_service
        for version in KUBERNETES:
            # strict: a misspelt or misplaced field is an error, not ignored.
            kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 5


def test_sqlite_keeps_its_data_dir_on_a_volume_claim() -> None:
    docs = render({})
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "Service", "Service", "Service", "StatefulSet"]
    sts = only(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    volumes = {v["name"]: v for v in pod(docs)["volumes"]}
    assert "data" not in volumes  # the claim, not an emptyDir
    assert not any("secret" in v for v in volumes.values())
    assert server_yaml(docs)["store"] == {"backend": "sqlite", "dsn": "store.db"}
    # No keys Secret named: the init step makes them into the volume.
    (init,) = pod(docs)["initContainers"]
    assert "--keys" not in init["args"]


def test_postgres_takes_the_dsn_and_keys_from_secrets_and_has_no_claim() -> None:
    docs = render(POSTGRES)
    sts = only(docs, "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in pod(docs)["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    assert volumes["store-dsn"]["secret"]["secretName"] == "llmgw-db"
    assert volumes["store-dsn"]["secret"]["items"] == [{"key": "uri", "path": "dsn"}]
    assert volumes["keys"]["secret"]["secretName"] == "llmgw-keys"
    mounts = {m["name"]: m["mountPath"] for m in container(docs, "server")["volumeMounts"]}
    assert mounts["store-dsn"] == "/etc/llmgw/store"
    store = server_yaml(docs)["store"]
    assert store == {"backend": "postgres", "dsn_file": "/etc/llmgw/store/dsn"}
    (init,) = pod(docs)["initContainers"]
    assert init["args"][init["args"].index("--keys") + 1] == "/etc/llmgw/keys"
    # The DSN Secret is referred to only with PostgreSQL.
    assert "llmgw-db" not in yaml.safe_dump_all(render({}))


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"store": {"backend": "postgres"}}, "secrets.existingSecret"),
        ({**POSTGRES, "store": {"backend": "postgres"}}, "store.dsn.existingSecret"),
        ({"agentService": {"type": "NodePort"}}, "agentService.nodePort"),
        ({"serviceMonitor": {"enabled": True}}, "serviceMonitor.tokenSecret.name"),
        ({"agents": {"enabled": True}}, "agents.joinToken.existingSecret"),
    ],
)
def test_incomplete_values_are_refused_naming_what_to_set(
    values: dict[str, Any], problem: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=problem.replace(".", r"\.")):
        render(values)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"store": {"backend": "etcd"}}, "/store/backend"),
        ({"agentService": {"type": "NodePort", "nodePort": 8443}}, "/agentService/nodePort"),
        ({"agentService": {"type": "External"}}, "/agentService/type"),
        ({"controlPlane": {"config": {"store": {"backend": "sqlite"}}}}, "/controlPlane/config"),
        ({"controlPlane": {"httpPort": 70000}}, "/controlPlane/httpPort"),
        ({"persistence": {"size": "ten gigs"}}, "/persistence/size"),
    ],
)
def test_values_of_the_wrong_kind_are_refused_where_they_are(
    values: dict[str, Any], where: str
) -> None:
    # values.schema.json, which Helm checks before rendering anything.
    with pytest.raises(helm.HelmValuesError, match=f"at '{where}'"):
        render(values)


def test_the_server_yaml_is_llmgws_own_and_matches_the_ports() -> None:
    docs = render(_merge(EVERYTHING))
    data = server_yaml(docs)
    config = build(ServerConfig, data, "the chart's server.yaml")
    assert config.advertise[:2] == ["llmgw.example.com", "203.0.113.7"]
    assert f"{RELEASE}-llmgw-agents.{NAMESPACE}.svc" in config.advertise
    assert config.scheduling.strategy == "spread"
    assert config.gateway.queue_wait == 60
    assert config.ha.name == f"{RELEASE}-llmgw"
    ports = {p["name"]: p["containerPort"] for p in container(docs, "server")["ports"]}
    assert ports == {"http": 8080, "agent": config.agent_port, "peer": config.ha.peer_port}
    assert config.listen == f"0.0.0.0:{ports['http']}"
    agents = only(docs, "Service", f"{RELEASE}-llmgw-agents")
    assert agents["spec"]["type"] == "LoadBalancer"
    assert {p["name"]: p["port"] for p in agents["spec"]["ports"]} == {
        "agent": config.agent_port,
        "http": 8080,
    }


def test_a_node_port_is_the_agents_port_everywhere() -> None:
    docs = render({"agentService": {"type": "NodePort", "nodePort": 30443}})
    assert server_yaml(docs)["agent_port"] == 30443
    agents = only(docs, "Service", f"{RELEASE}-llmgw-agents")
    (port,) = [p for p in agents["spec"]["ports"] if p["name"] == "agent"]
    assert port == {
        "name": "agent",
        "port": 30443,
        "targetPort": "agent",
        "protocol": "TCP",
        "nodePort": 30443,
    }
    ports = {p["name"]: p["containerPort"] for p in container(docs, "server")["ports"]}
    assert ports["agent"] == 30443


def test_probes_ask_healthz_on_the_http_port() -> None:
    server = container(render({}), "server")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert server[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe


@pytest.mark.parametrize("values", [{}, POSTGRES], ids=["sqlite", "postgres"])
def test_no_secret_is_written_in_a_config_map_or_rendered_at_all(
    values: dict[str, Any],
) -> None:
    docs = render(_merge(values, EVERYTHING))
    assert not [d for d in docs if d["kind"] == "Secret"]
    for doc in docs:
        if doc["kind"] != "ConfigMap":
            continue
        text = yaml.safe_dump(doc)
        for secret in ("PRIVATE KEY", "llmgw-admin-", "password", "dsn: host", "postgresql://"):
            assert secret not in text
    if values:  # PostgreSQL: the DSN is read from the mounted Secret
        assert "dsn" not in server_yaml(docs)["store"]


def test_service_monitor_scrapes_the_api_service_with_a_token() -> None:
    docs = render(_merge(EVERYTHING))
    monitor = only(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"] == {
        "name": "llmgw-metrics",
        "key": "admin.token",
    }
    # Exactly one Service matches its selector, and it has the port it names.
    wanted = monitor["spec"]["selector"]["matchLabels"]
    matching = [
        d
        for d in docs
        if d["kind"] == "Service" and wanted.items() <= d["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in matching] == [f"{RELEASE}-llmgw"]
    assert endpoint["port"] in {p["name"] for p in matching[0]["spec"]["ports"]}


def test_agents_daemonset_has_host_access_only_when_asked() -> None:
    assert not [d for d in render({}) if d["kind"] == "DaemonSet"]
    docs = render(_merge(EVERYTHING))
    spec = only(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    assert spec["runtimeClassName"] == "nvidia"
    (agent,) = spec["containers"]
    assert agent["securityContext"]["privileged"] is True
    assert agent["args"][:4] == ["agent", "run", "--server", f"{RELEASE}-llmgw-agents.llm.svc:8080"]
    (token,) = [e for e in agent["env"] if e["name"] == "LLMGW_JOIN_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": "llmgw-join", "key": "token"}
    # Kubernetes is asked for no GPU: llmgw places replicas itself.
    assert "nvidia.com/gpu" not in yaml.safe_dump(spec)


def _as_in_the_pod(args: list[str], root: Path) -> list[str]:
    """A container's arguments with the pod's paths moved under ``root``."""
    return [
        a.replace("/var/lib/llmgw", str(root / "volume")).replace("/etc/llmgw", str(root / "etc"))
        for a in args
    ]


def test_the_init_step_makes_the_data_dir_from_the_charts_server_yaml(tmp_path: Path) -> None:
    docs = render({})
    (init,) = pod(docs)["initContainers"]
    conf = tmp_path / "etc" / "config" / "server.yaml"
    conf.parent.mkdir(parents=True)
    conf.write_text(only(docs, "ConfigMap")["data"]["server.yaml"])
    for _ in range(2):  # every start of the pod runs it
        proc = subprocess.run(
            [sys.executable, "-m", "llmgw", *_as_in_the_pod(init["args"], tmp_path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
    server_args = _as_in_the_pod(container(docs, "server")["args"], tmp_path)
    data = Path(server_args[server_args.index("--data-dir") + 1])
    assert (data / "server.yaml").read_text() == conf.read_text()
    for part in ("store.db", "cluster.key", "admin.token", "pki/ca.crt", "pki/server.crt"):
        assert (data / part).is_file(), part
