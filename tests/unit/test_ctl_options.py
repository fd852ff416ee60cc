"""The client commands' option parsing (pykbroker/ctl) without a broker: record formats, start positions,
timestamps, exit-code mapping, the `cluster` group keeping `pykbroker cluster --data-dir`, and the
bootstrap-servers variable that `serve`'s configuration must not take for a setting."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from pykbroker.cli import build_config, main
from pykbroker.config import load_config
from pykbroker.ctl.common import BROKERS_ENV, EXIT_KAFKA_ERROR, EXIT_NOT_FOUND, EXIT_UNREACHABLE, exit_code_for, parse_timestamp
from pykbroker.ctl.consume import Start, formatter

RECORD = {"topic": "t", "partition": 2, "offset": 7, "timestamp": 1000, "key": None, "value": "v",
          "headers": [{"key": "a", "value": "1"}, {"key": "b", "value": None}]}


def test_record_formats():
    assert formatter("text")(RECORD) == "v"
    assert formatter("{topic}:{partition}@{offset} {key}={value} {headers}")(RECORD) == "t:2@7 =v a=1,b="
    assert formatter(r"{offset}\t{value}")(RECORD) == "7\tv"
    assert '"headers": [{"key": "a", "value": "1"}' in formatter("json")(RECORD)
    with pytest.raises(click.BadParameter, match="nope"):
        formatter("{nope}")


def test_start_positions():
    assert (Start("beginning", None).reset, Start("beginning", None).explicit) == ("earliest", False)
    assert (Start("latest", None).reset, Start("end", None).explicit) == ("latest", False)
    assert Start("-3", None).number == -3 and Start("-3", None).explicit
    assert Start("end", "2026-01-01T00:00:00Z").timestamp == 1767225600000
    with pytest.raises(click.BadParameter):
        Start("soon", None)


def test_timestamps():
    assert parse_timestamp("1767225600000") == 1767225600000
    assert parse_timestamp("2026-01-01T01:00:00+01:00") == 1767225600000
    assert parse_timestamp("2026-01-01T00:00:00.250") == 1767225600250  # no zone: UTC
    with pytest.raises(click.BadParameter):
        parse_timestamp("yesterday")


def test_exit_codes_for_kafka_errors():
    assert exit_code_for(3) == EXIT_NOT_FOUND  # UNKNOWN_TOPIC_OR_PART
    assert exit_code_for(69) == EXIT_NOT_FOUND  # GROUP_ID_NOT_FOUND
    assert exit_code_for(-195) == EXIT_UNREACHABLE  # _TRANSPORT
    assert exit_code_for(36) == EXIT_KAFKA_ERROR  # TOPIC_ALREADY_EXISTS


def test_brokers_variable_is_not_a_broker_setting(tmp_path, monkeypatch):
    config = load_config(env={BROKERS_ENV: "127.0.0.1:1,bogus", "PYKBROKER_PORT": "9999"},
                         cli={"data_dir": str(tmp_path)})
    assert config.port == 9999
    monkeypatch.setenv(BROKERS_ENV, "127.0.0.1:1,bogus")
    assert build_config({"data_dir": tmp_path, "port": 0}, ()).port == 0  # serve's path: no ConfigError


def test_cluster_group_keeps_the_dev_cluster_command():
    runner = CliRunner()
    missing = runner.invoke(main, ["cluster", "--brokers", "3"])
    assert missing.exit_code == 2 and "--data-dir" in missing.output
    helped = runner.invoke(main, ["cluster", "info", "--help"])
    assert helped.exit_code == 0 and "--brokers" in helped.output and BROKERS_ENV in helped.output
    assert runner.invoke(main, ["cluster", "--help"]).output.count("info") >= 1
