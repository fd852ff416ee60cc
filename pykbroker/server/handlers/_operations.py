"""Authorized-operation bit sets (Metadata, DescribeCluster, DescribeGroups, DescribeTopicPartitions).

pykbroker has no authorizer, so, as Kafka's AuthHelper.authorizedOperations answers without one, a client that
asks gets every operation the resource type supports (Kafka's AclEntry.supportedOperations), one bit per
AclOperation code (Utils.to32BitField); a client that does not ask gets Kafka's "not requested" value.
"""

from __future__ import annotations

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
