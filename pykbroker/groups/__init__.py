"""Consumer groups, shaped as Kafka's group-coordinator module: one room per group protocol.

- ``classic/``: the classic protocol (JoinGroup / SyncGroup / Heartbeat), client-side assignment.
- ``consumer/``: the consumer protocol of KIP-848 (ConsumerGroupHeartbeat): group, assignment and member epochs,
  per-member reconciliation, its ``__consumer_offsets`` records, classic members inside consumer groups and the
  migration between the protocols.
- ``assignors/``: the server-side assignors of the consumer protocol (``uniform``, ``range``), pure functions.
- ``consumer_protocol.py``: the ConsumerProtocol Subscription / Assignment bytes both protocols exchange.
- ``configs.py``: per-group configs (Kafka 4's GROUP config resource).
- ``offset_store.py``: committed offsets and the ``__consumer_offsets`` partitions this broker leads, shared by
  every protocol (its loader hands each protocol's records to that protocol).
"""
