"""The classic group protocol (JoinGroup / SyncGroup / Heartbeat / LeaveGroup), Kafka's ``classic/`` room.

``group.py`` is one group's state machine, ``coordinator.py`` the timers and the requests' entry points,
``records.py`` the GroupMetadataValue of ``__consumer_offsets``. Offsets are shared with the other group
protocols: they live in ``pykbroker.groups.offset_store``.
"""
