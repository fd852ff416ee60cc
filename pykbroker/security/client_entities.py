"""Client entity configs into the parts that enforce them: SCRAM credentials and client quotas.

Kafka keeps a user's SCRAM credentials and the user / client-id quotas in the same entity configs
(``/config/users/<user>``, ``/config/users/<user>/clients/<client>``, ``/config/clients/<client>``; the
single-node journal keeps the same entity paths, see cluster/metadata.py). The metadata backend tells its
client entity listeners each entity's whole config when it is loaded or changes; :func:`follow` applies
them as Kafka's ConfigHandlers do (UserConfigHandler: credentials, then quotas; ClientIdConfigHandler:
quotas):

* ``users/<user>``: the SCRAM keys (``SCRAM-SHA-256``, ``SCRAM-SHA-512``) replace the user's credentials in
  the ScramCredentialCache; the quota keys apply to the user entity;
* ``users/<user>/clients/<client>``, ``clients/<client>`` (``<default>`` for the defaults): the quota keys;
* ``ips/<ip>``: connection_creation_rate, which pykbroker does not enforce (logged once at debug).

A value that cannot be read (written by another tool or version) keeps what was known before, with a
warning naming the entity and the key, never the value (it may be a credential).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Mapping

from pykbroker.security.credentials import CredentialError, ScramCredentialCache
from pykbroker.security.quota_store import (
    IP,
    QUOTA_KEYS,
    USER,
    QuotaStoreError,
    entity_from_path,
    quota_entity,
)
from pykbroker.security.quotas import ClientQuotas

if TYPE_CHECKING:
    from pykbroker.cluster.metadata import ClusterMetadata

log = logging.getLogger(__name__)


def apply_client_entity(entity_path: str, configs: Mapping[str, str], credentials: ScramCredentialCache,
                        quotas: ClientQuotas) -> None:
    """Apply one client entity's whole config ({}: the entity is gone)."""
    try:
        entity = entity_from_path(entity_path)
    except QuotaStoreError as exc:
        log.warning("ignoring the configs of %s: %s", entity_path, exc)
        return
    if set(entity) == {USER} and entity[USER] is not None:
        try:
            credentials.update_user(entity[USER], configs)
        except CredentialError as exc:
            log.warning("the SCRAM credentials of user %s cannot be read (%s); the ones known before are kept",
                        entity[USER], type(exc).__name__)
    if IP in entity:
        if configs:
            log.debug("ip entity %s: connection_creation_rate is not enforced by pykbroker", entity_path)
        return
    target = quota_entity(entity)
    if target is None:
        return
    try:
        quotas.apply_entity_config(target, {k: v for k, v in configs.items() if k in QUOTA_KEYS})
    except ValueError as exc:
        log.warning("the quotas of %s cannot be read (%s); the ones known before are kept", entity_path, exc)


def follow(metadata: "ClusterMetadata", credentials: ScramCredentialCache, quotas: ClientQuotas) -> None:
    """Apply every client entity the backend knows now, then each change it reports."""
    for path, configs in metadata.client_entity_configs().items():
        apply_client_entity(path, configs, credentials, quotas)
    metadata.add_client_entity_listener(lambda path, configs: apply_client_entity(path, configs, credentials, quotas))
