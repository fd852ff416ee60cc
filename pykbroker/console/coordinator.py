"""Why consumer groups cannot start: FindCoordinator's own answer, which librdkafka's AdminClient hides.

While a cluster cannot create ``__consumer_offsets`` (Kafka's rule: as many live brokers as
``offsets.topic.replication.factor``, 3 by default), every group request waits: a client, and the console's
describe calls, see only a timeout. FindCoordinator says why: COORDINATOR_NOT_AVAILABLE with an
error_message (pykbroker names the cause, e.g. "the offsets topic __consumer_offsets cannot be created yet:
2 live brokers, offsets.topic.replication.factor=3 ..."; Kafka answers "The coordinator is not available.").
Asked only while the topic is absent; like any FindCoordinator (Kafka's AdminClient describing a group sends
one too) it makes a broker create the topic when it can.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Iterable

from kio.schema.errors import ErrorCode

from pykbroker.console.logdirs import CLIENT_ID, ask

FIND_COORDINATOR_KEY = 10
MIN_VERSION, MAX_VERSION = 1, 4  # v1+ carry error_message; v4 batches keys (one here)
OFFSETS_TOPIC = "__consumer_offsets"


def _request(version: int):
    module = importlib.import_module(f"kio.schema.find_coordinator.v{version}.request")
    if version >= 4:
        return module.FindCoordinatorRequest(coordinator_keys=(CLIENT_ID,))
    return module.FindCoordinatorRequest(key=CLIENT_ID)


async def _first_answer(brokers: list[tuple[str, int]], timeout: float):
    for host, port in brokers:
        response = await ask(host, port, timeout, FIND_COORDINATOR_KEY, MAX_VERSION, MIN_VERSION, _request)
        if response is not None:
            return response.coordinators[0] if hasattr(response, "coordinators") else response
    return None


def coordinator_problem(brokers: Iterable[tuple[str, int]], timeout: float) -> str | None:
    """What stops consumer groups, from the first of ``brokers`` (host, port) that answers FindCoordinator:
    "ERROR_NAME: error message", or None when a coordinator was found or no broker answered."""
    answer = asyncio.run(_first_answer(list(brokers), timeout))
    if answer is None or answer.error_code == ErrorCode.none:
        return None
    name = ErrorCode(answer.error_code).name.upper()
    message = answer.error_message
    return f"{name}: {message}" if message and message != name else name
