"""The packaged monitoring: the alerting rules pass ``promtool check rules`` and their
unit tests (``promtool test rules``), the Grafana dashboard is JSON whose every panel has
a datasource and queries, and the metric names both use are found. Also the Prometheus
harness (tests/support/prometheus.py) itself: a real Prometheus scrapes a small metrics
server that wants a bearer token, over http and over https.

promtool and prometheus come from Debian's ``prometheus`` package; without them these
tests fail (they do not skip) and say that ``make test`` installs it.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw import pki
from tests.support import prometheus
from tests.support.promnames import expr_metric_names, packaged_metric_names

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "packaging/prometheus/alerts.yml"
RULE_TESTS = REPO / "packaging/prometheus/alerts_test.yml"
EXAMPLE = REPO / "packaging/prometheus/prometheus.yml"
DASHBOARDS = sorted((REPO / "packaging/grafana").glob("*.json"))
ALERTS = {
    "LlmgwGpuXid",
    "LlmgwGpuEccUncorrected",
    "LlmgwGpuRemapFailed",
    "LlmgwGpuNvlinkErrors",
    "LlmgwGpuThermalThrottle",
    "LlmgwGpuPowerThrottle",
    "LlmgwGpuPcieDegraded",
    "LlmgwNodeNotReady",
    "LlmgwReplicasShort",
    "LlmgwGatewayErrorRate",
    "LlmgwKeyNearBudget",
}
TOKEN = "s3cret-scrape-token"
METRICS = b'# TYPE llmgw_node_up gauge\nllmgw_node_up{node="n1"} 1\n'


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail(f"promtool is not installed: {prometheus.INSTALL_HINT}")
    return subprocess.run(
        [exe, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def panels(node: Any) -> Iterator[dict[str, Any]]:
    """Every panel of a dashboard but rows, those nested in rows included."""
    for panel in node.get("panels") or []:
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


# --- the rules -------------------------------------------------------------------------


def test_promtool_checks_the_example_scrape_config(tmp_path: Path) -> None:
    """The example prometheus.yml: the control plane's job and the agents' http_sd job,
    both with the metrics token, checked by promtool with its files where it runs."""
    config = yaml.safe_load(EXAMPLE.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"llmgw", "llmgw-agents"}
    (sd,) = jobs["llmgw-agents"]["http_sd_configs"]
    assert sd["url"].endswith("/api/v1/prometheus/targets")
    token = tmp_path / "llmgw-metrics.token"
    token.write_text("llmgw-metrics-x")
    text = EXAMPLE.read_text().replace("/etc/prometheus/llmgw-metrics.token", str(token))
    (tmp_path / "prometheus.yml").write_text(text)
    shutil.copy(RULES, tmp_path / "alerts.yml")
    checked = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_checks_the_rules() -> None:
    proc = promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = promtool("test", "rules", str(RULE_TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_named_and_explained() -> None:
    found = {rule["alert"] for rule in rules()}
    assert found == ALERTS
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert set(rule["annotations"]) >= {"summary", "description", "fix"}, rule["alert"]
        if rule["alert"].startswith("LlmgwGpu"):
            text = rule["annotations"]["summary"] + rule["annotations"]["description"]
            assert "$labels.node" in text and "$labels.gpu" in text, rule["alert"]


def test_every_alert_has_a_unit_test_that_fires_and_one_that_does_not() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
            for alert in check.get("exp_alerts") or []:
                assert alert.get("exp_annotations"), (case["name"], check["alertname"])
    assert fires == ALERTS
    assert quiet == ALERTS


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The checks above would catch a bad file: promtool really does refuse one."""
    broken = tmp_path / "alerts.yml"
    broken.write_text(RULES.read_text().replace("> 0.9", "> > 0.9", 1))
    assert promtool("check", "rules", str(broken)).returncode != 0


# --- the dashboard ---------------------------------------------------------------------


def test_there_is_a_dashboard() -> None:
    assert [p.name for p in DASHBOARDS] == ["llmgw.json"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_loads_and_every_panel_queries_a_datasource(path: Path) -> None:
    dash = json.loads(path.read_text())
    assert dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert "label_values(llmgw_node_up, node)" in json.dumps(variables["node"]["query"])
    rows = [p["title"] for p in dash["panels"] if p.get("type") == "row"]
    assert rows == ["Fleet", "Node", "GPU", "Gateway"]
    all_panels = list(panels(dash))
    assert all_panels
    for panel in all_panels:
        title = panel.get("title")
        assert panel.get("datasource", {}).get("uid") == "${datasource}", title
        assert panel.get("targets"), title
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), title
            assert expr_metric_names(target["expr"]), (title, target["expr"])
    ids = [p["id"] for p in dash["panels"] if p.get("type") == "row"]
    ids += [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"


# --- the names -------------------------------------------------------------------------


def test_packaged_metric_names() -> None:
    names = packaged_metric_names(REPO)
    assert {
        "llmgw_gpu_xid_errors_total",
        "llmgw_gpu_throttled",
        "llmgw_gpu_pcie_link_width_max",
        "llmgw_node_up",
        "llmgw_model_replicas_wanted",
        "llmgw_key_budget_used_ratio",
        "llmgw_requests_total",
        "llmgw_errors_total",
        "llmgw_time_to_first_token_seconds_bucket",
        "llmgw_replica_joules_per_token",
    } <= names
    assert all(name.startswith("llmgw_") for name in names), sorted(names)


def test_expr_metric_names_leaves_out_functions_labels_and_literals() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (model, le) (rate(a_bucket{model=~"$m|x"}'
        "[$__rate_interval]))) / on() group_left b offset 1h > bool 1e3"
        ' or vector(0) unless label_replace(c, "dst", "$1", "src", "(.*)")'
    )
    assert expr_metric_names(expr) == {"a_bucket", "b", "c"}


# --- the Prometheus harness ------------------------------------------------------------


class MetricsHandler(BaseHTTPRequestHandler):
    """/metrics with a fixed body, for a bearer token only."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path != "/metrics":
            self.send_error(404)
        elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_error(401)
        else:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(METRICS)))
            self.end_headers()
            self.wfile.write(METRICS)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def metrics_server(tls: ssl.SSLContext | None = None) -> Iterator[str]:
    """Serve METRICS on 127.0.0.1 in a thread; yields host:port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def need_prometheus() -> None:
    if (why := prometheus.missing()) is not None:
        pytest.fail(why)


def test_metrics_server_wants_the_token() -> None:
    with metrics_server() as target:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{target}/metrics", timeout=5)
        err.value.close()
        assert err.value.code == 401
        req = urllib.request.Request(
            f"http://{target}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.read() == METRICS


@pytest.mark.usefixtures("need_prometheus")
def test_prometheus_scrapes_with_a_bearer_token() -> None:
    with metrics_server() as target, prometheus.start_prometheus(target, token=TOKEN) as prom:
        result = prom.wait_for('llmgw_node_up{node="n1"}', timeout=30)
        assert [r["value"][1] for r in result] == ["1"]
        assert result[0]["metric"]["job"] == prometheus.JOB
        assert [t["health"] for t in prom.targets()] == ["up"]


@pytest.mark.usefixtures("need_prometheus")
def test_wait_for_says_why_when_the_scrape_fails() -> None:
    with metrics_server() as target, prometheus.start_prometheus(target, token="wrong") as prom:
        with pytest.raises(AssertionError) as err:
            prom.wait_for('llmgw_node_up{node="n1"}', timeout=12)
    assert "401" in str(err.value)
    assert "'health': 'down'" in str(err.value)


@pytest.mark.usefixtures("need_prometheus")
def test_prometheus_scrapes_over_https_with_a_ca_file(tmp_path: Path) -> None:
    ca = pki.make_ca("promtest")
    cert = pki.make_server_cert(ca, ["127.0.0.1"])
    for name, pem in (("ca.crt", ca.cert_pem), ("s.crt", cert.cert_pem), ("s.key", cert.key_pem)):
        (tmp_path / name).write_bytes(pem)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
    with (
        metrics_server(tls) as target,
        prometheus.start_prometheus(
            target, scheme="https", token=TOKEN, ca_file=tmp_path / "ca.crt"
        ) as prom,
    ):
        assert prom.wait_for('llmgw_node_up{node="n1"}', timeout=30)
