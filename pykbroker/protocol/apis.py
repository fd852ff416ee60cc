"""The API support matrix (protocol_specs/api_support.json) and per-version codecs for each supported API.

One table answers both "what do we advertise in ApiVersions" and "which schema decodes this request";
the server's dispatcher checks at start that every API here has a handler and no handler lacks an entry.
Codecs come from kio, which is generated from Kafka's JSON message specs; readers and writers are built
once per (api, version) and cached, together with the frame guard (protocol/guard.py) that checks a
request body's lengths and counts before kio's native reader sees it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Callable

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from pykbroker.protocol import interbroker
from pykbroker.protocol.guard import compile_request_check

PRODUCE_KEY, FETCH_KEY, API_VERSIONS_KEY = 0, 1, 18


@dataclass(frozen=True, slots=True)
class ApiSupport:
    key: int
    name: str
    min_version: int
    max_version: int
    handler_module: str
    cluster_only: bool = False  # advertised and served only by a broker in a ZooKeeper cluster

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


def _load_matrix() -> dict[int, ApiSupport]:
    text = resources.files("pykbroker.protocol_specs").joinpath("api_support.json").read_text()
    apis = {}
    for entry in json.loads(text)["apis"]:
        apis[entry["key"]] = ApiSupport(entry["key"], entry["name"], entry["min"], entry["max"], entry["handler"],
                                        entry.get("cluster_only", False))
    return apis


SUPPORTED_APIS: dict[int, ApiSupport] = _load_matrix()
SINGLE_NODE_APIS: dict[int, ApiSupport] = {key: api for key, api in SUPPORTED_APIS.items() if not api.cluster_only}


def apis_for(cluster: bool) -> dict[int, ApiSupport]:
    """What a broker advertises and serves: the inter-broker and controller APIs only in a cluster."""
    return SUPPORTED_APIS if cluster else SINGLE_NODE_APIS


@dataclass(frozen=True, slots=True)
class ApiCodec:
    """Everything needed to decode one request version and encode its response."""

    api_key: int
    version: int
    request_type: type
    response_type: type
    read_request_header: Callable[[Any, int], tuple[Any, int]]
    check_request_body: Callable[[Any, int], int]
    read_request_body: Callable[[Any, int], tuple[Any, int]]
    write_response_body: Callable[[Any, Any], None]
    flexible_response_header: bool


@lru_cache(maxsize=None)
def codec_for(api_key: int, version: int) -> ApiCodec:
    if api_key in interbroker.APIS:  # LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown: not in kio
        return interbroker.codec_for(api_key, version).api_codec()
    request_type = load_request_schema(api_key, version)
    response_type = load_response_schema(api_key, version)
    response_header = response_type.__header_schema__
    return ApiCodec(
        api_key=api_key,
        version=version,
        request_type=request_type,
        response_type=response_type,
        read_request_header=entity_reader(request_type.__header_schema__),
        check_request_body=compile_request_check(request_type),
        read_request_body=entity_reader(request_type),
        write_response_body=entity_writer(response_type),
        # ApiVersions responses always use header v0, whatever the request version: kio's schemas carry
        # that rule in their header type, so ask the header rather than the body's __flexible__.
        flexible_response_header=response_header.__flexible__,
    )
