"""The first SCRAM users of a broker that is not running yet (``pykbroker scram add``), as
``kafka-storage.sh format --add-scram`` serves KRaft and ``kafka-configs.sh --zookeeper`` serves ZooKeeper mode.

Each argument is read by credentials.parse_add_scram (``SCRAM-SHA-256=[name=admin,password=admin-secret]``,
Kafka's StorageTool syntax) and stored where the broker keeps SCRAM credentials, next to the user's other
entity configs (quota keys kept):

- a single node's data dir (``add_to_data_dir``): the metadata journal's ``users/<user>`` entity config. The
  data dir's lock (log/manager.lock_data_dir, the one a running broker holds) is taken first: a data dir in use
  is refused (the running broker would not see the change; use AlterUserScramCredentials through it). A
  data dir that does not exist yet is made (with meta.properties, as the broker's first start makes it);
  one of a ZooKeeper-mode broker is refused (its credentials live in ZooKeeper).
- a cluster's ZooKeeper (``add_to_zookeeper``): ``/config/users/<user>`` written conditionally on its
  zkVersion (read again if another write raced it) with a change notification, so running brokers take it
  too.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Iterable

from pykbroker.security.credentials import (
    ScramCredential,
    ScramMechanism,
    rewrite_user_config,
    sanitize,
    user_config_with,
)

Entry = tuple[str, ScramMechanism, ScramCredential]  # what parse_add_scram returns


class BootstrapError(Exception):
    """Why the credentials could not be stored (one line for the command's user)."""


def _stored_node_id(data_dir: Path) -> int | None:
    """The node.id of the data dir's meta.properties, None without one; BootstrapError for a ZooKeeper-mode
    broker's (version 0, broker.id) or an unreadable one."""
    from pykbroker.cluster.metadata import META_PROPERTIES, meta_properties
    from pykbroker.log.checkpoint import CorruptFile

    try:
        props = meta_properties(data_dir)
    except CorruptFile as exc:
        raise BootstrapError(str(exc)) from None
    except OSError as exc:
        raise BootstrapError(f"cannot read {data_dir / META_PROPERTIES}: {exc.strerror or exc}") from None
    if props is None:
        return None
    if "node.id" not in props:
        raise BootstrapError(f"{data_dir} belongs to a broker of a ZooKeeper cluster ({data_dir / META_PROPERTIES} "
                             "has no node.id): its SCRAM credentials live in ZooKeeper, use --zookeeper")
    try:
        return int(props["node.id"])
    except ValueError:
        raise BootstrapError(f"{data_dir / META_PROPERTIES} has a node.id that is not a number") from None


async def _store(read, write, entries: list[Entry]) -> None:
    """Each entry's credential set in its user's config (``read(user)``, ``write(user, config, version)``)."""
    for user, mechanism, credential in entries:
        if not await rewrite_user_config(
                lambda: read(user), lambda config, version: write(user, config, version),
                lambda config: user_config_with(config, mechanism.name, credential), _stale_errors()):
            raise BootstrapError(f"the config of user {user!r} kept changing; try again")


def _stale_errors() -> tuple[type[Exception], ...]:
    from pykbroker.cluster.metadata import StaleConfigVersion
    from pykbroker.cluster.zookeeper import StaleZkVersion

    return StaleConfigVersion, StaleZkVersion


def add_to_data_dir(data_dir: Path, entries: Iterable[Entry], broker_id: int = 1) -> None:
    """Store the credentials in a single node's metadata journal (durable when this returns)."""
    from pykbroker.cluster.metadata import EmbeddedMetadata
    from pykbroker.log.checkpoint import CorruptFile
    from pykbroker.log.errors import LogDirectoryInUse
    from pykbroker.log.manager import lock_data_dir

    entries = list(entries)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        lock_fd = lock_data_dir(data_dir)
    except LogDirectoryInUse:
        raise BootstrapError(
            f"{data_dir} is locked by a running broker: stop it first, or add the user through it "
            "(kafka-configs.sh --bootstrap-server ... --alter --add-config 'SCRAM-SHA-256=[...]' "
            "--entity-type users --entity-name USER)") from None
    except OSError as exc:
        raise BootstrapError(f"cannot use data dir {data_dir}: {exc.strerror or exc}") from None
    try:
        stored = _stored_node_id(data_dir)
        try:
            metadata = EmbeddedMetadata(data_dir, stored if stored is not None else broker_id, "localhost", 0)
        except CorruptFile as exc:
            raise BootstrapError(str(exc)) from None
        try:
            asyncio.run(_store(
                lambda user: metadata.read_entity_configs_async("users", sanitize(user)),
                lambda user, config, version: metadata.set_client_entity_configs_async(
                    f"users/{sanitize(user)}", config, version=version),
                entries))
            metadata.commit().result()
        except OSError as exc:
            raise BootstrapError(f"cannot write the metadata journal in {data_dir}: {exc}") from None
        finally:
            metadata.close()
    finally:
        os.close(lock_fd)  # releases the lock


async def add_to_zookeeper(connect: str, entries: Iterable[Entry], timeout_s: float = 30.0) -> None:
    """Store the credentials in ZooKeeper's /config/users (``connect``: HOST:PORT[,...][/chroot])."""
    from pykbroker.cluster.zookeeper import KafkaZkClient

    try:
        zk = KafkaZkClient(connect, session_timeout_ms=10000, connection_timeout_ms=int(timeout_s * 1000))
    except ValueError as exc:  # a malformed connect string
        raise BootstrapError(f"cannot use ZooKeeper {connect!r}: {exc}") from None
    try:
        try:
            await zk.start()  # gives up after timeout_s
        except Exception as exc:  # noqa: BLE001 - kazoo's timeouts and connection errors: one line
            raise BootstrapError(f"cannot connect to ZooKeeper {connect} within {timeout_s:g} s "
                                 f"({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})") from None
        await _store(
            lambda user: zk.get_entity_config_versioned("users", sanitize(user)),
            lambda user, config, version: zk.set_entity_config("users", sanitize(user), config, version=version),
            entries)
    finally:
        await zk.close()
