"""The command line: --version, option-to-config mapping, and exit status 2 with the message for bad configs."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from pykbroker import __version__
from pykbroker.cli import ConfigUsageError, build_config, main

NO_FLAGS = {
    "host": None,
    "port": None,
    "data_dir": None,
    "advertised_host": None,
    "advertised_port": None,
    "listeners": None,
    "advertised_listeners": None,
    "broker_id": None,
    "log_level": None,
    "fsync": None,
}


@pytest.fixture(autouse=True)
def restore_root_logging():
    """``serve`` configures the root logger (with a handler on CliRunner's stream); undo it for later tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def clean_env() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("PYKBROKER_")}


def run_module(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pykbroker", *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=timeout,
    )


def test_version_via_python_m():
    result = run_module("--version")
    assert result.returncode == 0
    assert result.stdout == f"pykbroker {__version__}\n"
    assert __version__ == "0.1.0"


def test_serve_version():
    result = CliRunner().invoke(main, ["serve", "--version"])
    assert result.exit_code == 0
    assert result.stdout == f"pykbroker {__version__}\n"


def test_listener_flags_map_onto_kafka_keys(tmp_path, monkeypatch):
    monkeypatch.delenv("PYKBROKER_CONFIG", raising=False)
    flags = {
        **NO_FLAGS,
        "data_dir": tmp_path,
        "listeners": "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9093",
        "advertised_listeners": "PLAINTEXT://kafka.example:9092,INTERNAL://127.0.0.1:9093",
    }
    config = build_config(flags, ("listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT",))
    assert [(lst.name, lst.port) for lst in config.listeners] == [("PLAINTEXT", 9092), ("INTERNAL", 9093)]
    assert [lst.host for lst in config.advertised_listeners] == ["kafka.example", "127.0.0.1"]
    assert {"listeners", "advertised.listeners", "listener.security.protocol.map"} <= config.explicit


def test_serve_with_invalid_config_file_exits_2_with_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('"no.such.key" = 1\n"num.partitions" = 0\n')
    result = run_module("serve", "--config", str(bad), "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 2
    assert "WARNING" in result.stderr and "no.such.key" in result.stderr  # unknown keys warn, not fail
    assert "num.partitions" in result.stderr
    assert "Value must be at least 1" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "data").exists()


def test_serve_with_invalid_env_value_exits_2_naming_the_key(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("PYKBROKER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PYKBROKER_LOG_SEGMENT_BYTES", "huge")
    result = CliRunner().invoke(main, ["serve", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "log.segment.bytes" in result.stderr
    assert "PYKBROKER_LOG_SEGMENT_BYTES" in result.stderr


def test_serve_with_unparseable_toml_exits_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[log\nsegment.bytes = 1\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(bad)], env={"PYKBROKER_CONFIG": None})
    assert result.exit_code == 2
    assert "bad.toml is not valid TOML" in result.stderr


@pytest.mark.parametrize(
    "args",
    [["serve", "--port", "abc"], ["serve", "--fsync", "sometimes"], ["serve", "--override", "no-equals-sign"]],
)
def test_bad_options_exit_2(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "Error" in result.stderr


def test_build_config_flags_beat_overrides_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PYKBROKER_PORT", "1111")
    monkeypatch.setenv("PYKBROKER_NUM_PARTITIONS", "7")
    monkeypatch.delenv("PYKBROKER_CONFIG", raising=False)
    config_file = tmp_path / "server.properties"
    config_file.write_text("default.replication.factor=1\nlog.retention.hours=5\n")
    flags = {**NO_FLAGS, "port": 2222, "data_dir": tmp_path, "broker_id": 9, "log_level": "debug", "fsync": "always"}
    config = build_config(flags, ("num.partitions=3", "broker.id=4", "log.roll.ms=60000"), config_file)
    assert config.port == 2222  # flag over env
    assert config.get("num.partitions") == 3  # --override (a flag) over env
    assert config.broker_id == 9  # dedicated flag over --override
    assert config.topic_defaults()["segment.ms"] == 60000
    assert config.topic_defaults()["retention.ms"] == 5 * 3_600_000  # from the file
    assert config.topic_defaults()["flush.messages"] == 1  # fsync=always
    assert (config.data_dir, config.log_level) == (tmp_path, "DEBUG")


def test_build_config_turns_config_error_into_usage_error(tmp_path, monkeypatch):
    monkeypatch.delenv("PYKBROKER_CONFIG", raising=False)
    with pytest.raises(ConfigUsageError, match="message.max.bytes") as caught:
        build_config({**NO_FLAGS, "data_dir": tmp_path}, ("message.max.bytes=-1",))
    assert caught.value.exit_code == 2


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_serve_runs_broker_until_sigterm(tmp_path):
    pytest.importorskip("pykbroker.server.broker", reason="the broker is not assembled yet")
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "pykbroker", "serve", "--port", str(port), "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()[1]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "broker never listened"
                time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
