"""Partition sizes from DescribeLogDirs, which librdkafka's AdminClient does not expose.

Asked of every broker with pykbroker's own protocol client (kio codecs). A broker that does not advertise
DescribeLogDirs (ApiVersions), answers UNSUPPORTED_VERSION, cannot be reached or does not answer in time
contributes nothing: its replicas' sizes are unknown (None), which the pages show as "—".
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any, Iterable

from kio.schema.errors import ErrorCode

from pykbroker.protocol.client import ClientError, request_once

log = logging.getLogger(__name__)

DESCRIBE_LOG_DIRS_KEY = 35
# v1-v4 carry the same fields (v2+ flexible from v2, v3 adds the top-level error code, v4 total/usable bytes).
MIN_VERSION, MAX_VERSION = 1, 4
CLIENT_ID = "pykbroker-console"

Sizes = dict[tuple[str, int], int]


def _request(version: int):
    module = importlib.import_module(f"kio.schema.describe_log_dirs.v{version}.request")
    return module.DescribeLogDirsRequest(topics=None)


async def _broker_sizes(host: str, port: int, timeout: float, security: Any) -> Sizes | None:
    try:
        response = await request_once(host, port, _request, client_id=CLIENT_ID, timeout=timeout, security=security,
                                      negotiate=(DESCRIBE_LOG_DIRS_KEY, MIN_VERSION, MAX_VERSION))
    except (ClientError, TimeoutError, OSError) as exc:  # UnsupportedVersion is a ClientError
        log.debug("no DescribeLogDirs from %s:%s: %s", host, port, exc)
        return None
    if getattr(response, "error_code", ErrorCode.none) != ErrorCode.none:
        return None
    sizes: Sizes = {}
    for result in response.results:
        if result.error_code != ErrorCode.none:
            continue
        for topic in result.topics:
            for partition in topic.partitions:
                key = (str(topic.name), int(partition.partition_index))
                # A replica moving between log dirs is listed twice (future replica): the larger is the current.
                sizes[key] = max(sizes.get(key, 0), int(partition.partition_size))
    return sizes


async def _all_sizes(brokers: Iterable[tuple[int, str, int]], timeout: float,
                     security: Any) -> dict[int, Sizes | None]:
    brokers = list(brokers)
    results = await asyncio.gather(*(_broker_sizes(host, port, timeout, security) for _, host, port in brokers))
    return {broker_id: sizes for (broker_id, _, _), sizes in zip(brokers, results)}


def log_dir_sizes(brokers: Iterable[tuple[int, str, int]], timeout: float,
                  security: Any = None) -> dict[int, Sizes | None]:
    """{broker id: {(topic, partition): bytes} or None when that broker gave no sizes}, for the brokers
    given as (id, host, port), asked with ``security`` (protocol/client ClientSecurity: TLS, SASL); returns
    within about timeout seconds."""
    return asyncio.run(_all_sizes(brokers, timeout, security))
