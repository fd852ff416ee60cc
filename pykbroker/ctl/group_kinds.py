"""Both kinds of group (classic and consumer) as the brokers themselves describe them, for ``pykbroker group``
and the console: librdkafka's admin client knows only the classic groups' states (a consumer group Assigning or
Reconciling is its "Unknown") and no epochs, so these ask with pykbroker's protocol client:

* ``listed_types_and_states``: ListGroups v5 of every broker, group id -> (type, state);
* ``consumer_group_epochs``: ConsumerGroupDescribe at a consumer group's coordinator: its state, group and
  assignment epochs, assignor and each member's epoch.

Both answer what they could learn ({} / None when a broker cannot be asked or does not serve the version):
callers then show what the admin client said. For synchronous code (no running event loop).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any, Callable, Iterable

LIST_GROUPS_KEY, CONSUMER_GROUP_DESCRIBE_KEY = 16, 69


async def _ask(host: str, port: int, build: Callable[[Any], Any], timeout: float, security: Any,
               client_id: str) -> Any:
    """The answer to the request ``build(connection)`` makes (None: the broker cannot answer it)."""
    from pykbroker.protocol.client import KafkaClientConnection

    connection = await KafkaClientConnection.connect(host, port, client_id=client_id, connect_timeout=timeout,
                                                     request_timeout=timeout, security=security)
    try:
        request = build(connection)
        return await connection.send(request) if request is not None else None
    finally:
        await connection.aclose()


def _list_groups_request(connection: Any) -> Any:
    if connection.version_for(LIST_GROUPS_KEY, 5) < 5:
        return None
    module = importlib.import_module("kio.schema.list_groups.v5.request")
    return module.ListGroupsRequest(states_filter=(), types_filter=())


def listed_types_and_states(brokers: Iterable[tuple[str, int]], timeout: float, *, security: Any = None,
                            client_id: str = "pykbroker") -> dict[str, tuple[str, str]]:
    """group id -> (type, state) as the brokers' ListGroups v5 answer it ({} for a broker that could not)."""

    async def ask_all() -> list[Any]:
        return await asyncio.gather(*(_ask(host, port, _list_groups_request, timeout, security, client_id)
                                      for host, port in brokers), return_exceptions=True)

    found: dict[str, tuple[str, str]] = {}
    for answer in asyncio.run(ask_all()):
        if answer is not None and not isinstance(answer, BaseException) and answer.error_code == 0:
            found.update({g.group_id: (g.group_type, g.group_state) for g in answer.groups})
    return found


def consumer_group_epochs(host: str, port: int, group_id: str, timeout: float, *, security: Any = None,
                          client_id: str = "pykbroker") -> dict[str, Any] | None:
    """A consumer group's state, epochs, assignor and member epochs from its coordinator at host:port; None if
    it could not be asked or answered an error."""

    def request(connection: Any) -> Any:
        module = importlib.import_module("kio.schema.consumer_group_describe.v0.request")
        return module.ConsumerGroupDescribeRequest(group_ids=(group_id,), include_authorized_operations=False)

    try:
        answer = asyncio.run(_ask(host, port, request, timeout, security, client_id))
    except Exception:  # noqa: BLE001 - unreachable, refused, an old broker: the caller shows what it has
        return None
    (group,) = answer.groups
    if group.error_code != 0:
        return None
    return {"state": group.group_state, "group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
            "assignor": group.assignor_name, "member_epochs": {m.member_id: m.member_epoch for m in group.members}}


__all__ = ["listed_types_and_states", "consumer_group_epochs"]
