"""Authorized-operation bit sets (Metadata, DescribeCluster, DescribeGroups, DescribeTopicPartitions).

One bit per AclOperation code (Utils.to32BitField). With an authorizer, the operations the request's
principal may do on the resource (Kafka's AuthHelper.authorizedOperations, through _authorize.py);
without one, as Kafka answers then, every operation the resource type supports (AclEntry.supportedOperations).
A client that does not ask gets Kafka's "not requested" value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pykbroker.security.acl import CLUSTER_NAME, SUPPORTED_OPERATIONS
from pykbroker.server.handlers._authorize import AclOperation, ResourceType, cluster_allowed, operations

if TYPE_CHECKING:
    from pykbroker.server.dispatch import RequestContext

NOT_REQUESTED = -(2**31)  # Integer.MIN_VALUE: the field's default when the request did not ask


def _bits(resource_type: ResourceType) -> int:
    return sum(1 << int(op) for op in SUPPORTED_OPERATIONS[resource_type])


# every operation a resource type supports (Kafka's AclEntry.supportedOperations): the answer without an authorizer
TOPIC_OPERATIONS = _bits(ResourceType.TOPIC)
GROUP_OPERATIONS = _bits(ResourceType.GROUP)
CLUSTER_OPERATIONS = _bits(ResourceType.CLUSTER)


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
