"""Where the brokers pykbroker starts for tests differ from Kafka's defaults: one table for the pytest plugin
(pykbroker.testing) and pykbroker.testcontainers. It imports nothing, so that neither pulls the other's
dependencies in (testcontainers' users need no pytest; the plugin, loaded by every pytest run, no Docker).
"""

from __future__ import annotations

from typing import Any

# A group's first join does not wait group.initial.rebalance.delay.ms (3 s) for more members, as in
# testcontainers' Kafka module. Under the configs a user gives.
TEST_BROKER_CONFIG: dict[str, Any] = {"group.initial.rebalance.delay.ms": 0}
