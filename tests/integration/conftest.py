"""Fixtures for integration tests: real broker subprocesses, unique topic names, log tails on failure.

Fixtures:
  broker          a fresh broker for one test (use it when the test stops, kills or restarts it)
  broker_factory  make(config=None) -> started BrokerProcess; for tests that need their own config
  shared_broker   one broker per test module, for tests that only produce and read (unique topics)
  topic_name      a topic name unique to the test, safe to create on a shared broker

Every broker is stopped at teardown even if the test failed; when a test fails, the tail of each broker
log it used is attached to the report ("broker log" section).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from broker_process import BrokerProcess


class BrokerFactory:
    """Starts brokers in numbered subdirectories of one temp dir and closes them all at teardown."""

    def __init__(self, root: Path):
        self.root = root
        self.brokers: list[BrokerProcess] = []

    def make(self, config: dict | None = None) -> BrokerProcess:
        broker = BrokerProcess(self.root / f"broker{len(self.brokers)}", config=config)
        self.brokers.append(broker)
        return broker.start()

    __call__ = make

    def close(self) -> None:
        errors = []
        for broker in self.brokers:
            try:
                broker.close()
            except Exception as exc:  # close them all, then report
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def broker_factory(tmp_path):
    factory = BrokerFactory(tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory.make()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory) -> BrokerProcess:
    broker = BrokerProcess(tmp_path_factory.mktemp("shared-broker"))
    with broker:
        yield broker


@pytest.fixture
def topic_name(request) -> str:
    """Kafka-legal ([a-zA-Z0-9._-], < 249 chars), readable in broker logs, unique per test run."""
    base = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:60]
    return f"{base}-{uuid.uuid4().hex[:8]}"


def _brokers_used_by(item) -> list[BrokerProcess]:
    found = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, BrokerProcess):
            found.append(value)
        elif isinstance(value, BrokerFactory):
            found.extend(value.brokers)
    return list(dict.fromkeys(found))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for broker in _brokers_used_by(item):
            report.sections.append((f"broker log {broker.bootstrap} ({report.when})", broker.log_tail()))

