"""Kafka's transaction coordinator (core/src/main/scala/kafka/coordinator/transaction), ported onto the
broker's asyncio loop: ``metadata`` (TransactionMetadata and its state machine), ``log`` (the
__transaction_state record format), ``state_manager`` (TransactionStateManager: load/unload on leadership,
appends through the ReplicaManager), ``markers`` (TransactionMarkerChannelManager and its completion handler)
and ``coordinator`` (TransactionCoordinator: the request logic and the timeouts)."""
