"""Broker targets for the transaction tests: the same test runs against a real Apache Kafka 3.7.1 ("kafka", from
../shared/refkit) and against pykbroker ("pykbroker"), so what pykbroker does is checked against what Kafka does.

    from txn_targets import target            # the module-scoped fixture, parametrized ["kafka", "pykbroker"]
    def test_x(target): target.bootstrap ...

- "kafka": ONE reference Kafka for the whole test session (a JVM start is 5-15 s of a loaded machine), shared by
  every module that imports this fixture; skipped with the reason where the kit or Java is absent.
- "pykbroker": one pykbroker per module (never skipped: a broker refusing transactional ids fails the tests).

Select one target with ``-k "not pykbroker"`` (Kafka) or ``-k pykbroker``.
"""

from __future__ import annotations

import atexit

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v1.request import FindCoordinatorRequest
from kio.static.primitive import i8

from broker_process import BrokerProcess, send_request, wait_until

TARGETS = ["kafka", "pykbroker"]
TRANSACTION_KEY = 1

_reference: dict[str, BrokerProcess] = {}


def shared_reference_kafka(tmp_path_factory) -> BrokerProcess:
    """The session's reference Kafka 3.7.1, started on first use and stopped when the test process exits."""
    from reference_kafka import ReferenceKafka  # skips (pytest.skip) in its constructor without the kit/java

    if "kafka" not in _reference:
        kafka = ReferenceKafka(tmp_path_factory.mktemp("reference-kafka-txn"))
        kafka.start()
        _reference["kafka"] = kafka
        atexit.register(kafka.close)
    kafka = _reference["kafka"]
    if not kafka.is_running():  # a test must never stop it; restart rather than fail every later test
        kafka.start()
    return kafka


def wait_transaction_coordinator(broker: BrokerProcess, timeout: float = 60.0) -> None:
    """Kafka creates __transaction_state on the first FindCoordinator for a transactional id and answers
    COORDINATOR_NOT_AVAILABLE until it has a leader; wait for that once so client timeouts are not spent on it."""
    def ready() -> bool:
        response = send_request(broker.address, FindCoordinatorRequest(key="txn-tests-warmup",
                                                                       key_type=i8(TRANSACTION_KEY)))
        assert response.error_code != ErrorCode.transactional_id_authorization_failed, response.error_message
        return response.error_code == ErrorCode.none

    wait_until(ready, "a transaction coordinator", timeout)


@pytest.fixture(scope="module", params=TARGETS)
def target(request, tmp_path_factory):
    if request.param == "kafka":
        kafka = shared_reference_kafka(tmp_path_factory)
        wait_transaction_coordinator(kafka)
        yield kafka
        return
    broker = BrokerProcess(tmp_path_factory.mktemp("txn-pykbroker"))
    with broker:
        wait_transaction_coordinator(broker)
        yield broker
