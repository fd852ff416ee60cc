"""Consumer groups, shaped as Kafka's group-coordinator module: one room per group protocol.

- ``classic/``: the classic protocol (JoinGroup / SyncGroup / Heartbeat), client-side assignment.
- ``offset_store.py``: committed offsets and the ``__consumer_offsets`` partitions this broker leads, shared by
  every protocol (its loader hands each protocol's records to that protocol).
"""
