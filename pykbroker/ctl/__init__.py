"""``pykbroker`` as a Kafka command-line client (the rpk of this project), for pykbroker or any Kafka
cluster: it speaks the protocol only (librdkafka through confluent-kafka; pykbroker's own protocol client
for the bootstrap check, the group commands' FindCoordinator and ApiVersions per broker, with the same TLS and
SASL) and never reads a data dir.

Commands (each takes ``-b/--brokers`` or ``$PYKBROKER_BROKERS``, ``--timeout``, ``-X KEY=VALUE``,
``--command-config FILE`` (Kafka's client properties: TLS, SASL; pykbroker.ctl.security), ``-v``;
all but ``consume`` and ``produce`` print tables or, with ``--format json``, JSON)::

    pykbroker topic create|list|describe|alter-config|delete
    pykbroker produce TOPIC        lines of stdin as records
    pykbroker consume TOPIC...     records to stdout (text, JSON lines or a template)
    pykbroker group list|describe|seek|delete
    pykbroker cluster info

Exit codes: 0 ok; 1 the cluster answered with an error or refused the operation; 2 bad arguments or input;
3 the topic, partition or group does not exist; 4 no bootstrap broker reachable (said at once, naming each
address and why) or none answered within --timeout; 130 Ctrl-C.
"""

from __future__ import annotations

import click

from pykbroker.ctl.common import (
    EXIT_INTERRUPTED, EXIT_KAFKA_ERROR, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE,
)

__all__ = ["register", "EXIT_OK", "EXIT_KAFKA_ERROR", "EXIT_USAGE", "EXIT_NOT_FOUND", "EXIT_UNREACHABLE",
           "EXIT_INTERRUPTED"]


def register(main: click.Group, cluster: click.Group) -> None:
    """Add the client commands to the ``pykbroker`` group and ``info`` to its ``cluster`` group."""
    from pykbroker.ctl.cluster import info
    from pykbroker.ctl.consume import consume
    from pykbroker.ctl.group import group
    from pykbroker.ctl.produce import produce
    from pykbroker.ctl.topic import topic

    for command in (topic, produce, consume, group):
        main.add_command(command)
    cluster.add_command(info)
