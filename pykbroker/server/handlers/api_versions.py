"""ApiVersions (key 18), v0-4.

Behaviour: lists exactly the support matrix (protocol_specs/api_support.json) of the broker's mode: the
inter-broker and controller APIs (LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown,
ElectLeaders, AlterPartition) only in a cluster. The response always uses
response header v0. A request for a version we do not know is answered in the v0 body format with
UNSUPPORTED_VERSION and our ApiVersions range (KIP-511), so the client retries with a version we know.
"""

from __future__ import annotations

import io
import re
import struct

from pykbroker.protocol.apis import API_VERSIONS_KEY, SUPPORTED_APIS
from pykbroker.protocol.errors import ErrorCode
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.handlers._build import make, response_module


# Kafka's ApiVersionsRequest.SOFTWARE_NAME_VERSION_PATTERN (v3+: client_software_name and _version).
_SOFTWARE_NAME_VERSION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def valid_request(version: int, request) -> bool:
    """Kafka's ApiVersionsRequest.isValid: from v3 the client's software name and version match the pattern."""
    return version < 3 or all(_SOFTWARE_NAME_VERSION.fullmatch(value or "") for value in (
        request.client_software_name, request.client_software_version))


@handles(API_VERSIONS_KEY)
def api_versions(ctx: RequestContext, request) -> object:
    schema = response_module(ctx)
    if not valid_request(ctx.version, request):  # Kafka's KafkaApis: INVALID_REQUEST, nothing listed
        return make(schema.ApiVersionsResponse, error_code=ErrorCode.invalid_request, api_keys=(), throttle_time=0)
    keys = tuple(
        make(schema.ApiVersion, api_key=api.key, min_version=api.min_version, max_version=api.max_version)
        for api in sorted(ctx.broker.apis.values(), key=lambda api: api.key)
    )
    return make(schema.ApiVersionsResponse, error_code=ErrorCode.none, api_keys=keys, throttle_time=0)


def unsupported_api_versions_response(correlation_id: int) -> bytes:
    """A whole frame: header v0 + ApiVersionsResponse v0 body with error 35 and our ApiVersions range."""
    own = SUPPORTED_APIS[API_VERSIONS_KEY]
    body = io.BytesIO()
    body.write(struct.pack(">ih", correlation_id, ErrorCode.unsupported_version.value))
    body.write(struct.pack(">ihhh", 1, API_VERSIONS_KEY, own.min_version, own.max_version))
    payload = body.getvalue()
    return struct.pack(">i", len(payload)) + payload
