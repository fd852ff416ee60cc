"""Authorized-operation bit sets (Metadata, DescribeCluster, DescribeGroups, DescribeTopicPartitions).

One bit per AclOperation code (Utils.to32BitField). With an authorizer, the operations the request's
principal may do on the resource (Kafka's AuthHelper.authorizedOperations, through _authorize.py);
without one, as Kafka answers then, every operation the resource type supports (AclEntry.supportedOperations).
A client that does not ask gets Kafka's "not requested" value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pykbroker.security.acl import CLUSTER_NAME
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, cluster_allowed, operations

if TYPE_CHECKING:
    from pykbroker.server.dispatch import RequestContext

# AclOperation codes (org.apache.kafka.common.acl.AclOperation)
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12

NOT_REQUESTED = -(2**31)  # Integer.MIN_VALUE: the field's default when the request did not ask


def _bits(*operations: int) -> int:
    return sum(1 << op for op in set(operations))


TOPIC_OPERATIONS = _bits(READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, DESCRIBE_CONFIGS, ALTER_CONFIGS)
GROUP_OPERATIONS = _bits(READ, DESCRIBE, DELETE)
CLUSTER_OPERATIONS = _bits(CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE)


def operations_if(asked: bool, operations: int) -> int:
    """``operations`` when the request asked for them, else the "not requested" value."""
    return operations if asked else NOT_REQUESTED


def authorized_if(ctx: "RequestContext", asked: bool, resource_type: ResourceType, name: str, supported: int) -> int:
    """The resource's authorized operations for this request's principal when asked, else "not requested"."""
    return operations(ctx, resource_type, name, supported) if asked else NOT_REQUESTED


def cluster_operations_if(ctx: "RequestContext", asked: bool) -> int:
    """The cluster's authorized operations (Metadata v8-10, DescribeCluster): 0 without DESCRIBE on the
    cluster, as Kafka answers."""
    if not asked:
        return NOT_REQUESTED
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):
        return 0
    return operations(ctx, ResourceType.CLUSTER, CLUSTER_NAME, CLUSTER_OPERATIONS)
