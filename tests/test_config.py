"""Config files: unknown keys and bad values are refused naming file, key and what fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config import (
    AgentConfig,
    ConfigError,
    ServerConfig,
    dump,
    load,
    parse_hostport,
)


def _load(tmp_path: Path, text: str) -> ServerConfig:
    path = tmp_path / "server.yaml"
    path.write_text(text)
    return load(ServerConfig, path)


def test_defaults_and_round_trip(tmp_path: Path) -> None:
    config = _load(tmp_path, "")
    assert config.listen == "0.0.0.0:8080" and config.agent_port == 8443
    assert config.store.backend == "sqlite"
    again = _load(tmp_path, dump(ServerConfig(listen="10.0.0.1:9000", advertise=["10.0.0.1"])))
    assert again.listen == "10.0.0.1:9000" and again.advertise == ["10.0.0.1"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("listn: 0.0.0.0:1\n", "unknown key 'listn' (allowed: admin_listen, advertise,"),
        ("listen: somewhere\n", "listen: 'somewhere' is not HOST:PORT"),
        ("agent_port: 0\n", "agent_port: a port must be from 1 to 65535"),
        ("agent_port: '8443'\n", "agent_port: expected an integer"),
        ("heartbeat_interval: -1\n", "heartbeat_interval: must be greater than 0"),
        ("advertise: 10.0.0.1\n", "advertise: expected a list of a string"),
        ("store: {backend: mysql}\n", "store.backend: must be one of: sqlite, postgres"),
        ("store: {path: x}\n", "unknown key 'path' (allowed: backend, dsn, dsn_file)"),
        ("- a\n- b\n", "expected a map of settings"),
        ("listen: [\n", "not valid YAML"),
    ],
)
def test_refusals_name_file_key_and_allowed(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert str(tmp_path / "server.yaml") in str(info.value)
    assert problem in str(info.value)


def test_agent_config(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("server: 10.0.0.1:8080\nnode_id: gpu01\ndata_dirs: [/models]\n")
    config = load(AgentConfig, path)
    assert (config.server, config.node_id, config.data_dirs) == (
        "10.0.0.1:8080",
        "gpu01",
        ["/models"],
    )
    path.write_text("sever: x\n")
    with pytest.raises(ConfigError, match="unknown key 'sever'"):
        load(AgentConfig, path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:80", ("127.0.0.1", 80)),
        ("[::1]:8443", ("::1", 8443)),
        (":9000", ("0.0.0.0", 9000)),
        ("host.example:1", ("host.example", 1)),
    ],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected


def test_parse_hostport_refuses_bad_ports() -> None:
    for bad in ("h:0", "h:65536", "h:http", "h"):
        with pytest.raises(ConfigError):
            parse_hostport(bad)
    assert parse_hostport("h", default_port=5) == ("h", 5)


def test_every_problem_of_a_file_is_named_at_once(tmp_path: Path) -> None:
    text = (
        "listn: 0.0.0.0:1\n"
        "agent_port: 0\n"
        "store: {backend: mysql}\n"
        "gateway: {max_messages: 0, request_timeout: .nan, header_timeout: fast}\n"
        "advertise: [1, a.example]\n"
    )
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'server.yaml'}: 7 problems:")
    for problem in (
        "unknown key 'listn'",
        "agent_port: a port must be from 1 to 65535",
        "store.backend: must be one of: sqlite, postgres",
        "gateway.max_messages: must be from 1 to 1,000,000",
        "gateway.request_timeout: expected a number, got nan",
        "gateway.header_timeout: expected a number, got 'fast'",
        "advertise[0]: expected a string, got 1",
    ):
        assert problem in message, problem
