"""DescribeUserScramCredentials (key 50) v0 and AlterUserScramCredentials (key 51) v0 (KIP-554), as Kafka 3.7.1
in ZooKeeper mode answers them (ZkAdminManager.describeUserScramCredentials / alterUserScramCredentials;
``kafka-configs.sh --bootstrap-server ... --entity-type users``, the admin clients' SCRAM calls).

Where credentials live: a user's entity config ``users/<sanitized user>`` (single node: the metadata journal;
cluster: ZooKeeper's /config/users/<user> with a change notification), next to the user's quota keys, which
are kept (credentials.user_config_with). Every broker follows those configs into its ScramCredentialCache
(security/client_entities.py).

Describe (null or empty ``users``: every user with a credential, sorted by name):
- a user's ``CredentialInfos`` are (mechanism type, iterations), SCRAM-SHA-256 before SCRAM-SHA-512;
- RESOURCE_NOT_FOUND "Username must not be empty" for an empty name, "Attempt to describe a user credential
  that does not exist: <user>" for a user without one; DUPLICATE_RESOURCE "Cannot describe SCRAM credentials
  for the same user twice in a single request: <user>" for a user named twice (one result per user, in the
  request's order); an unreadable stored credential, or a user whose config cannot be read:
  UNKNOWN_SERVER_ERROR for that user. Every user failing to be listed (ZooKeeper unreachable): the
  top-level error, no results, as Kafka's ``describeUserScramCredentials``.
- As Kafka, each describe reads the store: on a cluster ZooKeeper (``read_entity_configs_async`` for named
  users, ``read_client_entity_configs_async`` for every user), so a change made through another broker is
  described at once, before its notification reaches this broker's credential cache; a single node's journal
  view is its store. A user znode whose name is not a sanitized name (``%FF``) is left out of "every user"
  with a warning (only entities with a SCRAM key are looked at).

Alter (codes and messages checked against Kafka 3.7.1 in ZooKeeper mode):
- per user, in Kafka's order of checks: an empty name (UNACCEPTABLE_CREDENTIAL "Username must not be empty"),
  an unknown mechanism type (UNSUPPORTED_SASL_MECHANISM "Unknown SCRAM mechanism"), iterations outside
  4096..16384 (UNACCEPTABLE_CREDENTIAL "Too few iterations" / "Too many iterations"); a (user, mechanism)
  named twice among the upsertions and deletions (DUPLICATE_RESOURCE "A user credential cannot be altered
  twice in the same request"); a deletion of a credential the user does not have (RESOURCE_NOT_FOUND
  "Attempt to delete a user credential that does not exist"); a credential that cannot be made (an empty
  salted password: UNKNOWN_SERVER_ERROR). A user with any such error is not changed at all; the others are.
- Each user's change is a read-modify-write of its entity config, conditional on the version read (cluster:
  the znode's zkVersion); a write that raced another (quotas write the same config) reads again.
- Kafka sends this request to the controller in ZooKeeper mode (a non-controller answers NOT_CONTROLLER); the
  Java client and librdkafka send it there, kafka-python to any broker: every pykbroker broker takes it, and
  the others learn the change through the notification.
- Messages are "" where Kafka sets none (its generated messages' default), not null.
- Single node: answered once the journal has it (KAFKA_STORAGE_ERROR for the changed users otherwise).

Authorization: Kafka answers CLUSTER_AUTHORIZATION_FAILED unless the principal may DESCRIBE (describe) or
ALTER (alter) the CLUSTER; ``describe_error_response`` / ``alter_error_response`` build those answers.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter

from pykbroker.cluster.metadata import StaleConfigVersion
from pykbroker.protocol.errors import ErrorCode
from pykbroker.security.credentials import (
    SCRAM_MECHANISMS,
    USERNAME_MUST_NOT_BE_EMPTY,
    CredentialError,
    credential_from_salted_password,
    credential_from_string,
    mechanism_for_type,
    rewrite_user_config,
    sanitize,
    user_config_with,
    validate_deletion,
    validate_upsertion,
)
from pykbroker.security.quota_store import DEFAULT_STRING, USER, QuotaStoreError, entity_from_path
from pykbroker.server.dispatch import RequestContext, handles
from pykbroker.server.error_answers import register_error_answer
from pykbroker.server.handlers._authorize import CLUSTER_DENIED_MESSAGE, AclOperation, cluster_allowed
from pykbroker.server.handlers._build import make, response_module
from pykbroker.server.handlers.topics_admin import _commit

log = logging.getLogger(__name__)

# Errors.UNKNOWN_SERVER_ERROR.message(): what Kafka puts in a result for an unexpected failure
UNKNOWN_SERVER_ERROR_MESSAGE = "The server experienced an unexpected error when processing the request."
_MECHANISMS_IN_ORDER = sorted(SCRAM_MECHANISMS.values(), key=lambda m: m.type)  # ScramMechanism.values()


def _user_path(user: str) -> str:
    return f"users/{sanitize(user)}"


# -- DescribeUserScramCredentials ------------------------------------------------------------------------

def describe_error_response(ctx: RequestContext, code: ErrorCode, message: str | None) -> object:
    """The whole request refused (Kafka's DescribeUserScramCredentialsRequest.getErrorResponse)."""
    return _describe_error(ctx.request.codec.response_type, code, message)


def _describe_error(response_type: type, code: ErrorCode, message: str | None) -> object:
    """Only the top-level code and message, no results."""
    return make(response_type, throttle_time=0, error_code=code, error_message=message, results=())


# A failure of the handler itself: the top-level code, no results (ApiError.fromThrowable's message).
register_error_answer(50, lambda request, code: _describe_error(
    request.codec.response_type, code, UNKNOWN_SERVER_ERROR_MESSAGE if code == ErrorCode.unknown_server_error else None))


def _credential_infos(schema, user: str, config: dict[str, str]):
    """(error code, message, credential infos) of a user's config with a credential; None without one."""
    values = [(m, config[m.name]) for m in _MECHANISMS_IN_ORDER if m.name in config]
    if not values:
        return None
    try:
        infos = tuple(make(schema.CredentialInfo, mechanism=m.type, iterations=credential_from_string(v).iterations)
                      for m, v in values)
    except CredentialError as exc:  # bad data written by another tool: named, never shown
        log.warning("the SCRAM credentials of user %r cannot be read: %s", user, type(exc).__name__)
        return ErrorCode.unknown_server_error, UNKNOWN_SERVER_ERROR_MESSAGE, ()
    return ErrorCode.none, "", infos


async def _every_user_config(metadata) -> dict[str, dict[str, str]]:
    """users/<u> entity path -> config, from the store (a cluster: ZooKeeper now; a single node: its journal)."""
    read_all = getattr(metadata, "read_client_entity_configs_async", None)
    if read_all is not None:
        return await read_all("users")
    return {path: config for path, config in metadata.client_entity_configs().items()
            if path.startswith("users/") and path.count("/") == 1}


def _user_of(path: str) -> str | None:
    """The user of a ``users/<sanitized>`` entity path (Kafka names the default entity ``<default>``); None,
    with a warning, for a name that is not a sanitized one."""
    try:
        user = entity_from_path(path)[USER]
    except QuotaStoreError:
        log.warning("user entity %r has a name that is not a sanitized user name: left out", path)
        return None
    return DEFAULT_STRING if user is None else user


@handles(50)
async def describe_user_scram_credentials(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.DESCRIBE):  # KafkaApis: DESCRIBE on the CLUSTER
        return describe_error_response(ctx, ErrorCode.cluster_authorization_failed, CLUSTER_DENIED_MESSAGE)
    schema = response_module(ctx)
    metadata = ctx.broker.metadata

    def result(user: str, code: ErrorCode = ErrorCode.none, message: str | None = "", infos=()):
        return make(schema.DescribeUserScramCredentialsResult, user=user, error_code=code, error_message=message,
                    credential_infos=infos)

    results = []
    if not request.users:  # null or empty: every user with a credential
        try:
            configs = await _every_user_config(metadata)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - Kafka: the top-level error, no results
            log.exception("cannot read the user entity configs to describe every user's SCRAM credentials")
            return describe_error_response(ctx, ErrorCode.unknown_server_error, UNKNOWN_SERVER_ERROR_MESSAGE)
        found = {}
        for path, config in configs.items():
            if not any(m.name in config for m in _MECHANISMS_IN_ORDER):
                continue  # no credential: its name does not matter
            user = _user_of(path)
            described = _credential_infos(schema, user, config) if user is not None else None
            if described is not None:
                found[user] = result(user, *described)
        results = [found[user] for user in sorted(found)]
    else:
        names = [entry.name for entry in request.users]
        counts = Counter(names)
        for user in dict.fromkeys(names):  # one result per user, in the request's order
            if not user:
                results.append(result(user, ErrorCode.resource_not_found, USERNAME_MUST_NOT_BE_EMPTY))
            elif counts[user] > 1:
                results.append(result(user, ErrorCode.duplicate_resource, "Cannot describe SCRAM credentials for "
                                                                          f"the same user twice in a single request: {user}"))
            else:
                try:
                    config, _ = await metadata.read_entity_configs_async("users", sanitize(user))
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - Kafka: this user's error, not the request's
                    log.exception("cannot read the entity config of user %r", user)
                    results.append(result(user, ErrorCode.unknown_server_error, UNKNOWN_SERVER_ERROR_MESSAGE))
                    continue
                described = _credential_infos(schema, user, config)
                if described is None:
                    described = (ErrorCode.resource_not_found,
                                 f"Attempt to describe a user credential that does not exist: {user}", ())
                results.append(result(user, *described))
    return make(schema.DescribeUserScramCredentialsResponse, throttle_time=0, error_code=ErrorCode.none,
                error_message="", results=tuple(results))


# -- AlterUserScramCredentials ---------------------------------------------------------------------------

def alter_error_response(ctx: RequestContext, request, code: ErrorCode, message: str | None) -> object:
    """Every user of the request refused (Kafka's AlterUserScramCredentialsRequest.getErrorResponse: each user
    of the deletions and upsertions once, sorted)."""
    return _alter_answer(ctx.request.codec.response_type, request, code, message)


def _alter_answer(response_type: type, request, code: ErrorCode, message: str | None) -> object:
    users = sorted({entry.name for entry in (*request.deletions, *request.upsertions)})
    return _alter_results(response_type, [(user, code, message) for user in users])


def _alter_results(response_type: type, results: list[tuple[str, ErrorCode, str | None]]) -> object:
    schema = sys.modules[response_type.__module__]
    return make(response_type, throttle_time=0, results=tuple(
        make(schema.AlterUserScramCredentialsResult, user=user, error_code=code, error_message=message)
        for user, code, message in results))


# A failure of the handler itself answers every user as Kafka's getErrorResponse does.
register_error_answer(51, lambda request, code: _alter_answer(request.codec.response_type, request.body, code, None))


def _illegal_users(request) -> dict[str, tuple[ErrorCode, str]]:
    """Kafka's illegalRequestsByUser: the deletions' errors, then the upsertions' (a later one replaces an
    earlier one of the same user)."""
    illegal: dict[str, tuple[ErrorCode, str]] = {}
    for deletion in request.deletions:
        error = validate_deletion(deletion.name, deletion.mechanism)
        if error is not None:
            illegal[deletion.name] = error
    for upsertion in request.upsertions:
        error = validate_upsertion(upsertion.name, upsertion.mechanism, upsertion.iterations)
        if error is not None:
            illegal[upsertion.name] = error
    return illegal


class _NotFound(Exception):
    """A deletion of a credential the user does not have."""


async def _alter_user(ctx: RequestContext, user: str, upsertions: list, deletions: list) -> None:
    """Apply one user's deletions then upsertions to its entity config, read and written conditionally."""
    metadata = ctx.broker.metadata

    def change(config: dict[str, str]) -> dict[str, str]:
        for deletion in deletions:
            name = mechanism_for_type(deletion.mechanism).name
            if name not in config:
                raise _NotFound()
            config = user_config_with(config, name, None)
        for upsertion in upsertions:
            mechanism = mechanism_for_type(upsertion.mechanism)
            credential = credential_from_salted_password(mechanism, upsertion.salt, upsertion.salted_password,
                                                         upsertion.iterations)
            config = user_config_with(config, mechanism.name, credential)
        return config

    if not await rewrite_user_config(
            lambda: metadata.read_entity_configs_async("users", sanitize(user)),
            lambda config, version: metadata.set_client_entity_configs_async(_user_path(user), config, version=version),
            change, StaleConfigVersion):
        raise RuntimeError(f"the config of user {user!r} kept changing")


@handles(51)
async def alter_user_scram_credentials(ctx: RequestContext, request) -> object:
    if not cluster_allowed(ctx, AclOperation.ALTER):  # KafkaApis: ALTER on the CLUSTER, every user refused
        return alter_error_response(ctx, request, ErrorCode.cluster_authorization_failed, CLUSTER_DENIED_MESSAGE)
    results: list[tuple[str, ErrorCode, str | None]] = []
    illegal = _illegal_users(request)
    results.extend((user, code, message) for user, (code, message) in illegal.items())

    pairs = [(u.name, u.mechanism) for u in request.upsertions if u.name not in illegal]
    pairs += [(d.name, d.mechanism) for d in request.deletions if d.name not in illegal]
    duplicated = dict.fromkeys(user for (user, _), count in Counter(pairs).items() if count > 1)
    results.extend((user, ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request")
                   for user in duplicated)

    changes: dict[str, tuple[list, list]] = {user: ([], []) for user, _ in pairs if user not in duplicated}
    for upsertion in request.upsertions:
        if upsertion.name in changes:
            changes[upsertion.name][0].append(upsertion)
    for deletion in request.deletions:
        if deletion.name in changes:
            changes[deletion.name][1].append(deletion)
    not_found, failed, changed = [], [], []
    for user, (upsertions, deletions) in changes.items():
        try:
            await _alter_user(ctx, user, upsertions, deletions)
        except _NotFound:
            not_found.append((user, ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Kafka's Errors.forException: this user fails, not the request
            if isinstance(exc, ValueError):  # a credential that cannot be made (an empty salted password)
                log.info("cannot alter the SCRAM credentials of user %r: %s", user, exc)
            else:
                log.exception("cannot alter the SCRAM credentials of user %r", user)
            failed.append((user, ErrorCode.unknown_server_error, UNKNOWN_SERVER_ERROR_MESSAGE))
        else:
            changed.append((user, ErrorCode.none, ""))
    if changed:
        not_durable = await _commit(ctx)
        if not_durable is not None:
            changed = [(user, not_durable.code, not_durable.message) for user, _, _ in changed]
    return _alter_results(ctx.request.codec.response_type, results + not_found + failed + changed)
