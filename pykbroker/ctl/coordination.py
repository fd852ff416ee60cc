"""Why consumer groups cannot start, worked out without side effects: shared by the console's groups pages
and the CLI's group commands (``pykbroker.ctl.group``), so that the two cannot disagree.

Kafka's rule (kept by pykbroker): ``__consumer_offsets`` is created (by the first FindCoordinator, or a
Metadata request allowed to create topics) only while at least ``offsets.topic.replication.factor`` brokers
(3 by default) are live; until then every group request waits and a client sees only timeouts. Asking
FindCoordinator would start creating the topic (a read-only look must not) and answers a bare
COORDINATOR_NOT_AVAILABLE on a fresh healthy cluster too, while the topic is being created. So this asks:

* Metadata (v12, ``allow_auto_topic_creation`` false, which Kafka honours for internal topics too) for
  ``__consumer_offsets`` only: the live brokers and whether the topic exists;
* DescribeConfigs (v4) of one live broker, sent to that broker (Kafka answers a broker's static configs only
  there), for ``offsets.topic.replication.factor``.

The problem is said only when the topic does not exist and fewer brokers are live than the factor asks for
(a pykbroker cluster member reports Kafka's default 3, its single node 1: the factor each uses). Works against
Apache Kafka as against pykbroker (pykbroker's own protocol client, with the TLS and SASL of ``security``, a
protocol/client ClientSecurity: pykbroker.ctl.security); when no broker answers, nothing is said.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Iterable

from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.static.primitive import i8

from pykbroker.cluster.metadata import internal_topic_shortfall
from pykbroker.protocol.client import ClientError, ClientSecurity, request_once

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
REPLICATION_KEY = "offsets.topic.replication.factor"
BROKER_RESOURCE = 4  # ConfigResource.Type.BROKER


def offsets_topic_shortfall(live_brokers: int, replication_factor: int) -> str | None:
    """The reason (worded as a pykbroker broker's FindCoordinator error_message) when ``live_brokers`` are
    too few for an offsets topic of ``replication_factor`` replicas, else None."""
    if live_brokers >= replication_factor:
        return None
    return internal_topic_shortfall(OFFSETS_TOPIC, live_brokers, replication_factor)


async def _replication_factor(host: str, port: int, broker_id: int, client_id: str, timeout: float,
                              security: ClientSecurity | None) -> int | None:
    request = DescribeConfigsRequest(
        resources=(DescribeConfigsResource(resource_type=i8(BROKER_RESOURCE), resource_name=str(broker_id),
                                           configuration_keys=(REPLICATION_KEY,)),),
        include_synonyms=False, include_documentation=False)
    response = await request_once(host, port, request, client_id=client_id, timeout=timeout, security=security)
    result = response.results[0]
    if result.error_code != ErrorCode.none:
        return None
    configs = {str(c.name): c for c in result.configs}
    factor = configs.get(REPLICATION_KEY)
    if factor is None or factor.value is None:
        return None
    return int(factor.value)


async def offsets_topic_problem_async(bootstrap: Iterable[tuple[str, int]], timeout: float,
                                      client_id: str = "pykbroker", *,
                                      security: ClientSecurity | None = None) -> str | None:
    """Why groups cannot start (see the module), from the first of ``bootstrap`` (host, port) that answers;
    None when they can (or it cannot be told: no answer, an error, no such config)."""
    request = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=OFFSETS_TOPIC),),
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    for host, port in bootstrap:
        try:
            metadata = await request_once(host, port, request, client_id=client_id, timeout=timeout,
                                          security=security)
        except (ClientError, OSError, TimeoutError) as exc:
            log.debug("no Metadata from %s:%s: %s", host, port, exc)
            continue
        if any(t.error_code == ErrorCode.none for t in metadata.topics) or not metadata.brokers:
            return None  # it exists: groups wait at most for its leaders
        live = len(metadata.brokers)
        for broker in sorted(metadata.brokers, key=lambda b: b.node_id):
            try:
                factor = await _replication_factor(broker.host, broker.port, int(broker.node_id), client_id, timeout,
                                                  security)
            except (ClientError, OSError, TimeoutError, ValueError) as exc:
                log.debug("no %s from broker %s: %s", REPLICATION_KEY, broker.node_id, exc)
                continue
            return None if factor is None else offsets_topic_shortfall(live, factor)
        return None
    return None


def offsets_topic_problem(bootstrap: Iterable[tuple[str, int]], timeout: float,
                          client_id: str = "pykbroker", *, security: ClientSecurity | None = None) -> str | None:
    """offsets_topic_problem_async, from synchronous code (no running event loop)."""
    return asyncio.run(offsets_topic_problem_async(list(bootstrap), timeout, client_id, security=security))
