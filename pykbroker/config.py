"""Broker configuration: Kafka's own config names and defaults, filled from flags, env and a file.

A Kafka user's knowledge carries over: the keys are Kafka's broker and topic config names (3.7.1), with
Kafka's types, defaults, validators and broker-to-topic synonyms (``log.segment.bytes`` is the broker
default for the topic config ``segment.bytes``). Where pykbroker's default differs from Kafka's, the
ConfigDef's doc says so (``broker.id``, ``offsets.topic.replication.factor``, ``log.flush.interval.ms``).

Sources, highest precedence first: command-line flags (and ``--override key=value``), environment
variables ``PYKBROKER_*`` (only those naming a known setting; the namespace is shared with tools around
the broker, ENV_NOT_SETTINGS, and any other PYKBROKER_ variable is warned about as a likely typo), the
``--config`` file, the defaults. The same key names work everywhere:
an environment variable is the key upper-cased with ``.`` as ``_`` (``PYKBROKER_NUM_PARTITIONS`` sets
``num.partitions``); a flag is the key with ``-`` (``--data-dir`` sets ``data.dir``). Besides Kafka's
keys there are pykbroker's own settings (``PYKBROKER_SETTINGS``): ``host``, ``port``,
``advertised.host``, ``advertised.port``, ``data.dir`` (Kafka's ``log.dir``/``log.dirs`` are accepted as
names for it), ``log.level`` and ``fsync``.

Listeners: ``host``/``port`` give one PLAINTEXT listener; Kafka's ``listeners`` (``NAME://host:port,...``,
one server socket each), ``advertised.listeners`` and ``listener.security.protocol.map`` take over when
set (host/port are then ignored with a warning). PLAINTEXT, SSL, SASL_PLAINTEXT and SASL_SSL listeners are served
(SSL with Kafka's ``ssl.*`` settings, per listener ``listener.name.<listener>.ssl.*``; SASL with
``sasl.enabled.mechanisms`` and ``listener.name.<listener>.<mechanism>.sasl.jaas.config``, see
security/sasl/authenticator.py). The inter-broker listener is Kafka's (``inter_broker_listener``): the one named by
``inter.broker.listener.name``, else the one named after ``security.inter.broker.protocol`` (default
PLAINTEXT). A listener on every interface is advertised under the canonical host name (see resolve_listeners).

The config file is TOML when its name ends in ``.toml`` (flat quoted keys ``"num.partitions" = 3`` or
tables that join to the dotted name, ``[log] segment.bytes = 1048576``), otherwise Kafka's
``server.properties`` format (``key=value``, ``#`` comments).

Every broker config name Kafka 3.7.1 defines is known (kafka_broker_configs.py: the ones pykbroker does not
use are accepted, stored and described, their doc says so). Unknown keys are logged as warnings and
ignored, as Kafka does, with the known key they resemble ("did you mean num.partitions?"); an invalid value is a ConfigError that
names the key, the accepted values and where the value came from.

Durability (``fsync``). Kafka itself never fsyncs by default: ``flush.ms`` and ``flush.messages`` are
Long.MAX_VALUE and it relies on the OS page cache plus replication. A kill -9 of the broker process loses
nothing either way, because written data is already in the page cache; only a power loss or kernel crash
tells the modes apart. ``fsync`` picks the defaults of Kafka's own flush keys, so the log honours one
mechanism, the per-topic ``flush.ms`` / ``flush.messages``:

* ``interval`` (pykbroker's default): ``log.flush.interval.ms`` = 1000, so at most about a second of
  acknowledged writes is exposed to a power loss;
* ``always``: ``log.flush.interval.messages`` = 1, an fsync before every acknowledgement;
* ``never``: Kafka's defaults, the page cache only.

Keys the user sets explicitly win over what ``fsync`` implies.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
import re
import socket
import tomllib
from dataclasses import dataclass, field, replace
from enum import IntEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Protocol

from pykbroker.kafka_broker_configs import KAFKA_BROKER_CONFIGS, METADATA_VERSIONS

log = logging.getLogger(__name__)

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1

_INTEGER_BOUNDS = {"short": (-(2**15), 2**15 - 1), "int": (-(2**31), INT_MAX), "long": (-(2**63), LONG_MAX)}
_INTEGER_TEXT = re.compile(r"[+-]?\d+")
_TYPE_NAMES = {
    "short": "a 16-bit integer",
    "int": "a 32-bit integer",
    "long": "a 64-bit integer",
    "double": "a number",
    "boolean": "true or false",
    "string": "a string",
    "list": "a comma-separated list",
    "class": "a class name",
    "password": "a string",
}
# DescribeConfigs v3+ config_type (KIP-569).
_TYPE_IDS = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "class": 8, "password": 9}


# Kafka's ConfigDef.parseType reasons for a string that is not of the config's type.
_KAFKA_TYPE_ERRORS = {
    "short": "Not a number of type SHORT",
    "int": "Not a number of type INT",
    "long": "Not a number of type LONG",
    "double": "Not a number of type DOUBLE",
    "boolean": "Expected value to be either true or false",
}


class ConfigError(ValueError):
    """An unknown or invalid configuration. ``name`` is the key (None for a file-level problem)."""

    def __init__(self, name: str | None, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


NAMES_LISTED = 10  # at most this many names in one error message


def listed_names(names: Iterable[str], separator: str = ", ", limit: int = NAMES_LISTED) -> str:
    """``names`` joined for an error message, the first ``limit`` of them and how many more (a request
    may name thousands: the answer stays small)."""
    names = list(names)
    shown = separator.join(names[:limit])
    return shown if len(names) <= limit else f"{shown}{separator}... ({len(names) - limit} more)"


class ConfigSource(IntEnum):
    """Kafka's DescribeConfigs ``config_source`` values."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


# ---------------------------------------------------------------------------------------------------
# Validators: each checks a typed value and raises ValueError with the reason, and describes what it
# accepts, so that an error message can always say what would have been right.


class Validator(Protocol):
    def check(self, value: Any) -> None: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Range:
    min: float | None = None
    max: float | None = None

    def check(self, value: Any) -> None:
        if self.min is not None and value < self.min:
            raise ValueError(f"Value must be at least {self.min}")
        if self.max is not None and value > self.max:
            raise ValueError(f"Value must be no more than {self.max}")

    def describe(self) -> str:  # Kafka's notation: [1,...], [0,...,1]
        low = "..." if self.min is None else str(self.min)
        return f"[{low},...]" if self.max is None else f"[{low},...,{self.max}]"


@dataclass(frozen=True)
class AboveZeroAtMost:
    """A number in (0, max]."""

    max: float

    def check(self, value: Any) -> None:
        if not 0 < value <= self.max:
            raise ValueError(f"Value must be greater than 0 and no more than {self.max}")

    def describe(self) -> str:
        return f"(0,...,{self.max}]"


@dataclass(frozen=True)
class OneOf:
    choices: tuple[str, ...]
    ignore_case: bool = False  # Kafka's CaseInsensitiveValidString

    def check(self, value: Any) -> None:
        if (value.lower() if self.ignore_case and isinstance(value, str) else value) not in self.choices:
            raise ValueError(f"String must be one of{' (case insensitive)' if self.ignore_case else ''}: "
                             f"{', '.join(self.choices)}")

    def describe(self) -> str:
        return "[" + ", ".join(self.choices) + "]"


@dataclass(frozen=True)
class EachOneOf:
    """A list whose every item is one of ``choices`` (Kafka's ValidList.in)."""

    choices: tuple[str, ...]

    def check(self, value: Any) -> None:
        for item in value:
            if item not in self.choices:
                raise ValueError(f"Invalid value {item} in list; each item must be one of: {', '.join(self.choices)}")

    def describe(self) -> str:
        return "[" + ", ".join(self.choices) + "]"


@dataclass(frozen=True)
class NonEmpty:
    """Kafka's NonEmptyString / NonNullValidator, by what ``description`` says (``non-empty string``,
    ``non-null string``); ``non-empty list`` is the description of controller.quorum.voters' validator,
    which accepts an empty list (a broker outside KRaft)."""

    description: str

    def check(self, value: Any) -> None:
        if value is None and "non-null" in self.description:
            raise ValueError("entry must be non null")
        if value == "" and self.description == "non-empty string":
            raise ValueError("String must be non-empty")

    def describe(self) -> str:
        return self.description


# Kafka 3.7.1 maps a release ("3.7", "0.10.0") to its last version only for released ones: 3.8-IV0 (not
# production-ready in 3.7.1) is accepted by its full name only, "3.8" and "3.8.0" are not valid versions.
_METADATA_SHORT_VERSIONS = frozenset(version.split("-")[0] for version in METADATA_VERSIONS if version != "3.8-IV0")


def metadata_version_index(text: str) -> int | None:
    """The position in METADATA_VERSIONS of the version ``text`` names (a release names its last one), or
    None. Kafka 3.7.1's MetadataVersion.fromVersionString: the first three dot-separated parts of a 0.x
    version (``0.10.0.0`` -> ``0.10.0``), else the first two (``3.7.1`` -> ``3.7``), must name a version,
    with or without its ``-IVn`` suffix."""
    parts = text.split(".")
    keep = 3 if text.startswith("0.") else 2
    key = text if keep >= len(parts) else ".".join(parts[:keep])
    if key in METADATA_VERSIONS:
        return METADATA_VERSIONS.index(key)
    if key in _METADATA_SHORT_VERSIONS:
        return max(i for i, version in enumerate(METADATA_VERSIONS) if version.split("-")[0] == key)
    return None


def metadata_version_known(text: str) -> bool:
    """Whether Kafka 3.7.1 accepts ``text`` as a MetadataVersion (see metadata_version_index)."""
    return metadata_version_index(text) is not None


def ignores_message_format_version(inter_broker_protocol_version: str) -> bool:
    """Kafka's LogConfig.shouldIgnoreMessageFormatVersion: inter.broker.protocol.version 3.0-IV1 or later."""
    index = metadata_version_index(inter_broker_protocol_version)
    return index is not None and index >= METADATA_VERSIONS.index("3.0-IV1")


class KafkaVersion:
    """Kafka's MetadataVersionValidator (message.format.version, inter.broker.protocol.version)."""

    def check(self, value: Any) -> None:
        if not metadata_version_known(value):
            raise ValueError(f"Version {value} is not a valid version")

    def describe(self) -> str:
        return "[" + ", ".join(METADATA_VERSIONS) + "]"


class VerbatimRefusal(ValueError):
    """A validator's refusal that Kafka words without its "Invalid value ... for configuration ..." frame."""


class ConnectionsPerIpOverrides:
    """max.connections.per.ip.overrides as KafkaConfig reads it: ``host:count`` pairs (CoreUtils.parseCsvMap,
    the count by Java's Integer.parseInt), refused in Kafka's words (an exception's message)."""

    def check(self, value: Any) -> None:
        key = "max.connections.per.ip.overrides"
        for item in (re.split(r"\s*,\s*", value) if value else ()):
            colon = item.rfind(":")
            if colon < 0:
                raise VerbatimRefusal(f"Error parsing configuration property '{key}': begin 0, end -1, length {len(item)}")
            count = item[colon + 1:].strip()
            if not re.fullmatch(r"[+-]?\d+", count) or not -2**31 <= int(count) < 2**31:
                raise VerbatimRefusal(f'For input string: "{count}"')

    def describe(self) -> str:
        return "host:count pairs, comma-separated"


class ThrottledReplicas:
    """Kafka's ThrottledReplicaListValidator: ``*`` or ``partition:broker`` pairs."""

    _PAIR = re.compile(r"\d+:\d+")

    def check(self, value: Any) -> None:
        if value == ["*"] or all(self._PAIR.fullmatch(item) for item in value):
            return
        raise ValueError(f"Value must be {self.describe()}")

    def describe(self) -> str:
        return "the literal '*' or a list of replicas in the format [partitionId]:[brokerId],[partitionId]:[brokerId],..."


# ---------------------------------------------------------------------------------------------------
# One configuration key.


@dataclass(frozen=True)
class ConfigDef:
    """One Kafka config: its name, type, default (Kafka's unless ``doc`` says otherwise) and validator.

    ``synonyms`` (topic configs only) are the broker keys that supply the topic default, highest
    priority first (``retention.ms`` <- ``log.retention.ms``, ``log.retention.minutes``,
    ``log.retention.hours``); the first one with a value wins, converted to the topic's unit.
    """

    name: str
    type: str
    default: Any
    doc: str
    validator: Validator | None = None
    synonyms: tuple[str, ...] = ()
    read_only: bool = False
    sensitive: bool = False

    @property
    def type_id(self) -> int:
        """The DescribeConfigs ``config_type`` number for this key's type."""
        return _TYPE_IDS[self.type]

    def accepted(self) -> str:
        """What this key accepts, in words: its type and, when it has one, its validator's range or set."""
        described = _TYPE_NAMES[self.type]
        return f"{described} in {self.validator.describe()}" if self.validator else described

    def parse(self, raw: Any, *, kafka_wording: bool = False) -> Any:
        """Turn a raw value (a string from a file or env, or a native TOML/Python value) into the typed
        value, and validate it. Raises ConfigError naming this key and what it accepts; ``kafka_wording``:
        in Kafka's words, as its ConfigDef says them in an AlterConfigs answer ("Invalid value abc for
        configuration x: Not a number of type LONG")."""
        try:
            value = _coerce(self.type, raw)
        except ValueError as exc:
            reason = _KAFKA_TYPE_ERRORS.get(self.type, str(exc)) if kafka_wording else f"{exc}; accepted: {self.accepted()}"
            raise self._invalid(raw, reason, kafka_wording) from None
        if self.validator is not None and value is not None:
            try:
                self.validator.check(value)
            except VerbatimRefusal as exc:
                if kafka_wording:
                    raise ConfigError(self.name, str(exc)) from None
                raise self._invalid(raw, str(exc)) from None
            except ValueError as exc:  # the validator's reason already states the range or the choices
                raise self._invalid(raw, str(exc), kafka_wording) from None
        return value

    def _invalid(self, raw: Any, reason: str, kafka_wording: bool = False) -> ConfigError:
        shown = repr(raw) if isinstance(raw, str) and not kafka_wording else str(raw)
        return ConfigError(self.name, f"Invalid value {shown} for configuration {self.name}: {reason}")

    def format(self, value: Any) -> str | None:
        """The value as Kafka shows it in DescribeConfigs and CreateTopics responses."""
        if value is None or self.sensitive:
            return None
        if self.type == "boolean":
            return "true" if value else "false"
        if self.type == "list":
            return ",".join(value)
        if self.type == "double":  # as Java's Double.toString: 0.5, 1.0, 1.7976931348623157E308
            mantissa, _, exponent = repr(float(value)).partition("e")
            return f"{mantissa if '.' in mantissa else mantissa + '.0'}E{int(exponent)}" if exponent else mantissa
        return str(value)


def _coerce(type_: str, raw: Any) -> Any:
    """Parse ``raw`` as ``type_``. Strings follow Kafka's parsing (trimmed); native values must already
    have the right kind (a TOML ``true`` for a boolean, an integer for an int, ...)."""
    if raw is None:
        return None
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if type_ in _INTEGER_BOUNDS:
        if isinstance(raw, str) and _INTEGER_TEXT.fullmatch(raw.strip()):
            value = int(raw.strip())
        elif isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        else:
            raise ValueError(f"not {_TYPE_NAMES[type_]}")
        low, high = _INTEGER_BOUNDS[type_]
        if not low <= value <= high:
            raise ValueError(f"not {_TYPE_NAMES[type_]} (between {low} and {high})")
        return value
    if type_ == "double":
        if isinstance(raw, str):
            try:
                value = float(raw.strip())
            except ValueError:
                raise ValueError("not a number") from None
        elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
            value = float(raw)
        else:
            raise ValueError("not a number")
        if not math.isfinite(value):
            raise ValueError("not a finite number")
        return value
    if type_ == "boolean":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise ValueError("not true or false")
    if type_ == "list":
        if isinstance(raw, str):
            text = raw.strip()
            return [item.strip() for item in text.split(",")] if text else []
        if isinstance(raw, (list, tuple)) and all(isinstance(item, str) for item in raw):
            return [item.strip() for item in raw]
        raise ValueError("not a comma-separated string or a list of strings")
    if isinstance(raw, Password) and type_ == "password":
        return raw
    if isinstance(raw, str):  # string, class, password
        return Password(raw.strip()) if type_ == "password" else raw.strip()
    raise ValueError(f"not {_TYPE_NAMES[type_]}")


class Password:
    """A password config's value (Kafka's Password): ``value`` is the secret; its repr and str hide it, so a
    BrokerConfig logged or shown in an error never says it (DescribeConfigs shows it as null, sensitive)."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "[hidden]"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Password) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


# ---------------------------------------------------------------------------------------------------
# The tables. Broker configs are read-only in DescribeConfigs except DYNAMIC_BROKER_CONFIG_NAMES.

_HOUR_MS = 3_600_000
_MINUTE_MS = 60_000
# Broker synonyms in a coarser unit than their topic config: multiply to get milliseconds.
_SYNONYM_UNIT_MS = {
    "log.retention.minutes": _MINUTE_MS,
    "log.retention.hours": _HOUR_MS,
    "log.roll.hours": _HOUR_MS,
    "log.roll.jitter.hours": _HOUR_MS,
}

_AT_LEAST_0 = Range(0)
_AT_LEAST_1 = Range(1)
_COMPRESSION_TYPES = OneOf(("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"))
_TIMESTAMP_TYPES = OneOf(("CreateTime", "LogAppendTime"))
_CLEANUP_POLICIES = EachOneOf(("compact", "delete"))
_MESSAGE_FORMAT_VERSION = KafkaVersion()
# Kafka 3.7.1's lower bound (LegacyRecord.RECORD_OVERHEAD_V0); Kafka 4 raised it to 1 MiB, which would
# forbid the small segments that exercise rolling in tests.
_MIN_SEGMENT_BYTES = Range(14)


def _table(*defs: ConfigDef) -> dict[str, ConfigDef]:
    return {d.name: d for d in defs}


# Kafka 3.7.1's update mode of every broker config it defines (kafka_broker_configs.py): read-only,
# per-broker or cluster-wide.
_KAFKA_UPDATE_MODES = {row[0]: row[4] for row in KAFKA_BROKER_CONFIGS}

# The broker configs pykbroker applies while it runs when AlterConfigs / IncrementalAlterConfigs change them
# (per broker or as the cluster-wide default, see cluster/dynamic_configs.py): the topic defaults (a live log
# takes its topic's new configs), the replication throttles, the cleaner's settings and the verifier switch.
APPLIED_DYNAMIC_CONFIG_NAMES = frozenset({
    "compression.type", "log.cleanup.policy", "log.cleaner.delete.retention.ms", "log.cleaner.max.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio", "log.cleaner.min.compaction.lag.ms", "log.flush.interval.messages",
    "log.flush.interval.ms", "log.index.interval.bytes", "log.index.size.max.bytes", "log.local.retention.bytes",
    "log.local.retention.ms", "log.message.downconversion.enable", "log.message.timestamp.after.max.ms",
    "log.message.timestamp.before.max.ms", "log.message.timestamp.difference.max.ms", "log.message.timestamp.type",
    "log.preallocate", "log.retention.bytes", "log.retention.ms", "log.roll.jitter.ms", "log.roll.ms",
    "log.segment.bytes", "log.segment.delete.delay.ms", "message.max.bytes", "min.insync.replicas",
    "leader.replication.throttled.rate", "follower.replication.throttled.rate",
    # the cleaner's own settings: its loops and workers start again with them (LogCleaner.reconfigure)
    "log.cleaner.threads", "log.cleaner.backoff.ms", "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.size",
    "log.cleaner.io.buffer.load.factor",
    "transaction.partition.verification.enable",  # the broker switches its verifier (server/broker.py)
    "unclean.leader.election.enable",  # the controller reads it at each election (cluster/controller.py)
})
# Every broker config AlterConfigs accepts (read_only false in DescribeConfigs): Kafka 3.7.1's dynamic ones
# (DynamicBrokerConfig.AllDynamicConfigs) and the two replication throttles (its ZooKeeper-mode
# DynamicConfig.Broker). Those pykbroker does not apply (the listeners, connection limits, thread counts,
# SSL/SASL settings, ...) are stored and described, and their doc says that a new value has no effect here.
DYNAMIC_BROKER_CONFIG_NAMES = APPLIED_DYNAMIC_CONFIG_NAMES | frozenset(
    name for name, mode in _KAFKA_UPDATE_MODES.items() if mode != "read-only"
)
# Kafka's per-broker dynamic configs: AlterConfigs refuses them as the cluster default ("broker id must be
# specified").
PER_BROKER_CONFIG_NAMES = frozenset(name for name, mode in _KAFKA_UPDATE_MODES.items() if mode == "per-broker")
_NOT_APPLIED = " A dynamic change (AlterConfigs) is stored and described, but pykbroker does not apply it while running."


# Defaults of a cluster member (zookeeper.connect set) where the single node's differ: the single node's
# offsets topic has one replica, a cluster's Kafka's 3 (so DescribeConfigs reports what the broker uses).
CLUSTER_DEFAULTS = {"offsets.topic.replication.factor": 3}


def _broker(name: str, type_: str, default: Any, doc: str, validator: Validator | None = None) -> ConfigDef:
    dynamic = name in DYNAMIC_BROKER_CONFIG_NAMES
    if dynamic and name not in APPLIED_DYNAMIC_CONFIG_NAMES:
        doc += _NOT_APPLIED
    return ConfigDef(name, type_, default, doc, validator, read_only=not dynamic, sensitive=type_ == "password")


BROKER_CONFIGS: dict[str, ConfigDef] = _table(
    # identity and cluster
    _broker("broker.id", "int", 1, "This broker's id. pykbroker's default is 1 (Kafka's -1 means generate one).", _AT_LEAST_0),
    _broker("node.id", "int", -1, "Kafka's KRaft name of broker.id (its KafkaConfig.populateSynonyms): set without "
            "broker.id, it is the broker id; set with it, both must be equal; described as the broker id."),
    _broker("broker.rack", "string", None, "The broker's rack, reported in Metadata responses."),
    _broker(
        "zookeeper.connect",
        "string",
        None,
        "ZooKeeper connection string (host:port[,host:port][/chroot]); empty means the embedded single-node metadata.",
    ),
    _broker("zookeeper.session.timeout.ms", "int", 18000, "ZooKeeper session timeout.", _AT_LEAST_1),
    _broker("zookeeper.connection.timeout.ms", "int", None, "Max wait to connect to ZooKeeper; unset uses the session timeout."),
    _broker("controller.socket.timeout.ms", "int", 30000, "Socket timeout for controller-to-broker requests."),
    _broker(
        "inter.broker.listener.name",
        "string",
        None,
        "The listener brokers and the controller reach each other on; unset: the listener named after "
        "security.inter.broker.protocol (PLAINTEXT by default), as in Kafka. Only one of the two may be set.",
    ),
    _broker("controlled.shutdown.enable", "boolean", True, "Hand leaderships over to other brokers before stopping."),
    _broker("controlled.shutdown.max.retries", "int", 3, "Controlled shutdown attempts before an unclean stop."),
    _broker("controlled.shutdown.retry.backoff.ms", "long", 5000, "Wait between controlled shutdown attempts."),
    # listeners (see resolve_listeners)
    _broker("listeners", "string", None, "NAME://host:port,... to listen on; unset: one PLAINTEXT listener on host:port."),
    _broker("advertised.listeners", "string", None, "NAME://host:port,... given to clients; unset: the listeners."),
    _broker(
        "listener.security.protocol.map",
        "string",
        "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "Each listener name's security protocol (NAME:PROTOCOL,...); pykbroker serves PLAINTEXT and SSL.",
    ),
    # topics
    _broker("num.partitions", "int", 1, "Default number of partitions of a new topic.", _AT_LEAST_1),
    _broker("default.replication.factor", "int", 1, "Default replication factor of a new topic.", _AT_LEAST_1),
    _broker("auto.create.topics.enable", "boolean", True, "Create a topic when a client asks Metadata about an unknown one."),
    _broker("delete.topic.enable", "boolean", True, "Allow DeleteTopics; when false it fails with TOPIC_DELETION_DISABLED."),
    _broker(
        "max.broker.partitions", "int", 10000,
        "Most partitions this broker hosts (KIP-578's name; pykbroker's own limit): beyond it CreateTopics and "
        "CreatePartitions get POLICY_VIOLATION. 10,000 measured: ~5 kB of memory each, start in 3.4 s.", _AT_LEAST_1,
    ),
    _broker("min.insync.replicas", "int", 1, "Minimum in-sync replicas for an acks=all write.", _AT_LEAST_1),
    _broker("unclean.leader.election.enable", "boolean", False, "Allow a replica outside the ISR to become leader."),
    _broker("auto.leader.rebalance.enable", "boolean", True, "Move leadership back to preferred replicas periodically."),
    _broker("leader.imbalance.check.interval.seconds", "long", 300, "How often the controller checks leader balance.", _AT_LEAST_1),
    _broker("leader.imbalance.per.broker.percentage", "int", 10, "Allowed leader imbalance per broker, in percent."),
    # records and log segments
    _broker("message.max.bytes", "int", 1048588, "Largest record batch the broker accepts.", _AT_LEAST_0),
    _broker("compression.type", "string", "producer", "Final compression of topic data; producer keeps the producer's.", _COMPRESSION_TYPES),
    _broker("log.segment.bytes", "int", 1073741824, "Maximum size of one log segment file.", _MIN_SEGMENT_BYTES),
    _broker("log.roll.ms", "long", None, "Roll a segment after this many ms; unset uses log.roll.hours."),
    _broker("log.roll.hours", "int", 168, "Roll a segment after this many hours.", _AT_LEAST_1),
    _broker("log.roll.jitter.ms", "long", None, "Random jitter subtracted from the roll time; unset uses log.roll.jitter.hours."),
    _broker("log.roll.jitter.hours", "int", 0, "Random jitter subtracted from the roll time, in hours.", _AT_LEAST_0),
    _broker("log.retention.ms", "long", None, "Delete segments older than this (-1: never); unset uses the minutes/hours keys."),
    _broker("log.retention.minutes", "int", None, "Retention in minutes; unset uses log.retention.hours."),
    _broker("log.retention.hours", "int", 168, "Retention in hours."),
    _broker("log.retention.bytes", "long", -1, "Delete old segments beyond this partition size (-1: no limit)."),
    _broker("log.retention.check.interval.ms", "long", 300000, "How often retention runs.", _AT_LEAST_1),
    _broker("log.cleanup.policy", "list", ["delete"], "Default cleanup policy: delete and/or compact.", _CLEANUP_POLICIES),
    _broker("log.cleaner.enable", "boolean", True, "Run the log cleaner for compacted topics."),
    _broker("log.cleaner.delete.retention.ms", "long", 86400000, "How long tombstones stay in a compacted topic.", _AT_LEAST_0),
    _broker("log.cleaner.min.compaction.lag.ms", "long", 0, "Minimum age of a record before compaction.", _AT_LEAST_0),
    _broker("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, "Maximum age of a record before compaction.", _AT_LEAST_1),
    _broker("log.cleaner.min.cleanable.ratio", "double", 0.5, "Dirty ratio that makes a log eligible for cleaning.", Range(0, 1)),
    _broker("log.cleaner.threads", "int", 1, "Worker processes cleaning compacted logs.", _AT_LEAST_0),
    _broker("log.cleaner.backoff.ms", "long", 15000, "Sleep when no log needs cleaning.", _AT_LEAST_0),
    _broker("log.cleaner.dedupe.buffer.size", "long", 134217728,
            "Memory for the cleaners' key -> offset maps, shared by all cleaner threads (an entry takes about 128 bytes)."),
    _broker("log.cleaner.io.buffer.size", "int", 524288, "Read buffer of the cleaner, shared by all cleaner threads.", _AT_LEAST_0),
    _broker("log.cleaner.io.buffer.load.factor", "double", 0.9, "How full the cleaner's key -> offset map may get.",
            AboveZeroAtMost(1.0)),
    _broker("log.index.interval.bytes", "int", 4096, "Bytes of log between two offset index entries.", _AT_LEAST_0),
    _broker("log.index.size.max.bytes", "int", 10485760, "Maximum size of an offset index file.", Range(4)),
    _broker("log.segment.delete.delay.ms", "long", 60000, "Delay before a deleted segment's files are removed.", _AT_LEAST_0),
    _broker("log.preallocate", "boolean", False, "Preallocate segment files."),
    _broker("log.local.retention.ms", "long", -2, "Local retention with tiered storage (-2: use retention.ms).", Range(-2)),
    _broker("log.local.retention.bytes", "long", -2, "Local retention with tiered storage (-2: use retention.bytes).", Range(-2)),
    _broker(
        "log.flush.interval.ms",
        "long",
        None,
        "fsync a partition's log at least this often. Kafka's default is unset (never); pykbroker sets 1000 "
        "when fsync=interval (its default).",
        _AT_LEAST_0,
    ),
    _broker(
        "log.flush.interval.messages",
        "long",
        LONG_MAX,
        "fsync after this many unflushed messages; pykbroker sets 1 when fsync=always.",
        _AT_LEAST_1,
    ),
    _broker("log.flush.scheduler.interval.ms", "long", LONG_MAX, "How often the flusher checks whether a log needs a flush."),
    _broker("log.flush.offset.checkpoint.interval.ms", "int", 60000, "How often the recovery point is checkpointed.", _AT_LEAST_0),
    _broker(
        "log.flush.start.offset.checkpoint.interval.ms", "int", 60000, "How often log start offsets are checkpointed.", _AT_LEAST_0
    ),
    _broker("log.message.timestamp.type", "string", "CreateTime", "Default timestamp type of topics.", _TIMESTAMP_TYPES),
    _broker(
        "log.message.timestamp.difference.max.ms", "long", LONG_MAX, "Deprecated: max timestamp skew of a record.", _AT_LEAST_0
    ),
    _broker("log.message.timestamp.before.max.ms", "long", LONG_MAX, "How far in the past a record's timestamp may be.", _AT_LEAST_0),
    _broker("log.message.timestamp.after.max.ms", "long", LONG_MAX, "How far in the future a record's timestamp may be.", _AT_LEAST_0),
    _broker("log.message.format.version", "string", "3.0-IV1", "Deprecated message format version.", _MESSAGE_FORMAT_VERSION),
    _broker("log.message.downconversion.enable", "boolean", True, "Allow down-conversion for old fetch versions."),
    # consumer groups and the offsets topic
    _broker("offsets.topic.num.partitions", "int", 50, "Partitions of __consumer_offsets.", _AT_LEAST_1),
    _broker(
        "offsets.topic.replication.factor",
        "short",
        1,
        "Replication factor of __consumer_offsets. Kafka's default, 3, in a cluster (zookeeper.connect set); "
        "1 on the single node.",
        _AT_LEAST_1,
    ),
    _broker("offsets.topic.segment.bytes", "int", 104857600, "Segment size of __consumer_offsets.", _AT_LEAST_1),
    _broker("offsets.retention.minutes", "int", 10080, "Keep committed offsets of an empty group this long.", _AT_LEAST_1),
    _broker("offsets.retention.check.interval.ms", "long", 600000, "How often stale offsets are expired.", _AT_LEAST_1),
    _broker("offsets.commit.timeout.ms", "int", 5000, "Max wait for an offset commit to be replicated.", _AT_LEAST_1),
    _broker("group.initial.rebalance.delay.ms", "int", 3000, "Wait this long for more members before the first rebalance."),
    _broker("group.min.session.timeout.ms", "int", 6000, "Smallest session timeout a group member may ask for."),
    _broker("group.max.session.timeout.ms", "int", 1800000, "Largest session timeout a group member may ask for."),
    _broker("group.max.size", "int", INT_MAX, "Maximum members in one group.", _AT_LEAST_1),
    _broker("group.consumer.migration.policy", "string", "bidirectional",
            "Kafka 4's online migration of a non-empty group between the classic and the consumer protocol: "
            "upgrade (a classic group becomes a consumer group when a consumer-protocol member joins), downgrade "
            "(back when its last consumer-protocol member leaves), bidirectional or disabled. Empty groups change "
            "protocol whatever it says. pykbroker does not convert a non-empty group yet: the policy picks Kafka's "
            "reason for refusing one (groups/consumer/coordinator.py).",
            OneOf(("disabled", "upgrade", "downgrade", "bidirectional"), ignore_case=True)),
    # producers and transactions
    _broker("producer.id.expiration.ms", "int", 86400000, "Forget an idle producer id's state after this long.", _AT_LEAST_1),
    _broker(
        "producer.id.expiration.check.interval.ms", "int", 600000, "How often expired producer ids are removed.", _AT_LEAST_1
    ),
    _broker("transactional.id.expiration.ms", "int", 604800000, "Expire an idle transactional id after this long.", _AT_LEAST_1),
    _broker("transaction.max.timeout.ms", "int", 900000, "Largest transaction timeout a producer may ask for.", _AT_LEAST_1),
    _broker("transaction.state.log.num.partitions", "int", 50, "Partitions of __transaction_state.", _AT_LEAST_1),
    _broker(
        "transaction.state.log.replication.factor",
        "short",
        3,
        "Replication factor of __transaction_state in a cluster (Kafka's default 3; a single node uses 1).",
        _AT_LEAST_1,
    ),
    _broker("transaction.state.log.min.isr", "int", 2,
            "min.insync.replicas of __transaction_state (capped at its replication factor).", _AT_LEAST_1),
    _broker("transaction.state.log.segment.bytes", "int", 104857600, "Segment size of __transaction_state.", _AT_LEAST_1),
    _broker("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000,
            "How often transactions older than their timeout are aborted.", _AT_LEAST_1),
    _broker("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000,
            "How often expired transactional ids are removed.", _AT_LEAST_1),
    _broker("transaction.partition.verification.enable", "boolean", True,
            "Verify with the transaction coordinator that a partition is in the transaction before a producer's "
            "first transactional write to it (KIP-890)."),
    # replication
    _broker("replica.lag.time.max.ms", "long", 30000, "A follower this far behind leaves the ISR."),
    _broker("replica.fetch.max.bytes", "int", 1048576, "Bytes a follower fetches per partition.", _AT_LEAST_0),
    _broker("replica.fetch.response.max.bytes", "int", 10485760, "Bytes a follower fetches per request.", _AT_LEAST_0),
    _broker("replica.fetch.min.bytes", "int", 1, "Minimum bytes a follower's fetch waits for."),
    _broker("replica.fetch.wait.max.ms", "int", 500, "Max wait of a follower's fetch."),
    _broker("replica.fetch.backoff.ms", "int", 1000, "Sleep after a follower fetch error.", _AT_LEAST_0),
    _broker("replica.socket.timeout.ms", "int", 30000, "Socket timeout of follower fetches."),
    _broker("replica.high.watermark.checkpoint.interval.ms", "long", 5000, "How often high-water marks are checkpointed."),
    _broker("num.replica.fetchers", "int", 1, "Fetcher tasks per source broker."),
    # Kafka's DynamicConfig.Broker throttles (bytes/s), set with kafka-configs.sh --entity-type brokers; read
    # through broker.dynamic_configs.value() by partition reassignment.
    _broker("leader.replication.throttled.rate", "long", LONG_MAX,
            "Replication bytes/s a leader sends for the replicas in a topic's leader.replication.throttled.replicas.", _AT_LEAST_0),
    _broker("follower.replication.throttled.rate", "long", LONG_MAX,
            "Replication bytes/s a follower fetches for the replicas in a topic's follower.replication.throttled.replicas.", _AT_LEAST_0),
    # network
    _broker("socket.request.max.bytes", "int", 104857600, "Largest request the broker reads.", _AT_LEAST_1),
    _broker("fetch.max.bytes", "int", 57671680, "Largest fetch response the broker builds.", Range(1024)),
    _broker("connections.max.idle.ms", "long", 600000, "Close connections idle this long (no request received, no response progress; a connection stuck mid-frame is idle); -1: never."),
    _broker("queued.max.request.bytes", "long", 209715200,
            "Broker-wide bound on the bytes of requests being received (Kafka's default -1 is unbounded; ours is 200 MiB): "
            "a frame reserves its whole size when its length is read; while the reserved bytes reach the bound, a "
            "connection starting a frame larger than 64 KiB is not read until memory frees. A value <= 0 is unbounded; "
            "otherwise it must be at least socket.request.max.bytes, as in Kafka."),
    _broker("max.connections", "int", 2147483647, "Connections the broker holds open; at the limit it stops accepting until one closes (KIP-402).", _AT_LEAST_0),
    _broker("max.connections.per.ip", "int", 2147483647, "Connections accepted from one IP address; new ones beyond it are closed.", _AT_LEAST_0),
    # metrics and health endpoints (pykbroker/metrics; pykbroker's own keys, not Kafka's)
    _broker("metrics.port", "int", 0, "Serve /metrics (Prometheus), /health and /ready over HTTP on this port; 0: off.",
            Range(0, 65535)),
    _broker("metrics.host", "string", None, "Address the metrics endpoint listens on; unset: the broker's host."),
    # the authorizer's (Kafka's AclAuthorizer and StandardAuthorizer read it; KafkaConfig does not define it)
    _broker("super.users", "string", None, "Principals allowed every operation (User:alice;User:bob), as Kafka's "
            "authorizers read it; used when authorizer.class.name turns ACLs on."),
    _broker("allow.everyone.if.no.acl.found", "string", None, "With an authorizer, whether a resource with no ACL "
            "is open to everyone (true) or to super users only (false, the default), as Kafka's authorizers read it."),
)


# Why a Kafka broker config pykbroker does not use has no effect here, by the start of its name (first match).
_UNUSED_REASONS = (
    (("sasl.kerberos.", "sasl.login.", "sasl.client.", "sasl.oauthbearer."),
     "pykbroker's SASL listeners serve PLAIN, SCRAM and OAUTHBEARER without Kerberos or broker-side logins"),
    (("sasl.", "security.", "principal.builder.", "delegation.token.", "password.encoder."),
     "pykbroker has no delegation tokens, custom principal builders or password encoder"),
    (("remote.log.",), "pykbroker has no tiered storage"),
    (("zookeeper.ssl.", "zookeeper.set.acl", "zookeeper.clientCnxnSocket", "zookeeper.max.in.flight."),
     "pykbroker's ZooKeeper client (kazoo) connects without TLS and ACLs"),
    (("process.roles", "controller.", "metadata.", "broker.heartbeat.", "broker.session.",
      "initial.broker.registration.", "early.start.listeners", "eligible.leader.replicas.",
      "zookeeper.metadata.migration."), "a KRaft setting; pykbroker runs as a single node or in ZooKeeper mode"),
    (("num.io.threads", "num.network.threads", "background.threads", "num.recovery.threads.", "queued.max.requests",
      "num.replica.alter.log.dirs.threads", "group.coordinator.threads"),
     "pykbroker serves every connection on one asyncio event loop"),
)


def _unused_doc(name: str, mode: str) -> str:
    reason = next((why for prefixes, why in _UNUSED_REASONS if name.startswith(prefixes)), "pykbroker does not use it")
    changeable = "read-only" if mode == "read-only" else f"dynamic ({mode})"
    if name.startswith("ssl."):
        return (f"Kafka 3.7.1's {name}, {changeable} as in Kafka: read by SSL listeners at start where it is a "
                f"server setting (also as listener.name.<listener>.{name}); pykbroker/security/tls.py says what each "
                f"ssl.* setting does here.")
    return f"Kafka 3.7.1's {name}, {changeable} as in Kafka: accepted, stored and described; no effect here ({reason})."


def _kafka_validator(type_: str, valid: str) -> Validator | None:
    """A validator from Kafka's notation of valid values (kafka_broker_configs.py)."""
    if not valid:
        return None
    if valid == "metadata-version":
        return KafkaVersion()
    if valid.startswith("non-"):
        return NonEmpty(valid)
    bounds = re.fullmatch(r"\[(-?[\d.]+),\.\.\.(?:,(-?[\d.]+))?\]", valid)
    if bounds:
        low, high = (None if b is None else (float(b) if "." in b else int(b)) for b in bounds.groups())
        return Range(low, high)
    choices = tuple(item.strip() for item in valid.strip("[]").split(","))
    return EachOneOf(choices) if type_ == "list" else OneOf(choices)


def _kafka_default(type_: str, text: str | None) -> Any:
    return None if text is None else _coerce(type_, text)


# Every other broker config Kafka 3.7.1 defines, from its catalogue: known (a config file, --override and
# AlterConfigs accept it, with Kafka's type, default, validator and update mode; DescribeConfigs lists it) but
# not used. log.dir and log.dirs are pykbroker's data.dir (_SETTING_ALIASES) and are described as such.
_USED_KAFKA_DOCS = {
    "authorizer.class.name": "Turns ACLs on: kafka.security.authorizer.AclAuthorizer or "
                             "org.apache.kafka.metadata.authorizer.StandardAuthorizer (both: Kafka's ZooKeeper-mode "
                             "ACL semantics, pykbroker/security/authorizer.py); empty: every operation allowed.",
    "log.dirs": "pykbroker's data directory (data.dir, --data-dir; one directory, not a list); described as the "
                "data directory in use, STATIC_BROKER_CONFIG when set by any of those names.",
    "log.dir": "pykbroker's data directory (data.dir) when log.dirs is not set, as in Kafka; described with the "
               "value it was set to.",
}
# The SASL settings SASL_PLAINTEXT and SASL_SSL listeners read at start (security/sasl/, security/jaas.py; also as
# listener.name.<listener>.<name>, and the per-mechanism ones as listener.name.<listener>.<mechanism>.<name>).
_SASL_AT_START = "read by SASL listeners at start (a new value takes effect at the next start)"
_USED_KAFKA_DOCS.update({
    "sasl.enabled.mechanisms": f"The SASL mechanisms a SASL listener serves: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, "
                               f"OAUTHBEARER (GSSAPI, Kafka's default, is refused at start); {_SASL_AT_START}.",
    "sasl.jaas.config": f"The JAAS login module of a mechanism, set as listener.name.<listener>.<mechanism>."
                        f"sasl.jaas.config (the unprefixed key is ignored, as by Kafka's broker); {_SASL_AT_START}.",
    "sasl.server.callback.handler.class": f"Only Kafka's own handlers (OAUTHBEARER: its signed-JWT validator), as "
                                          f"listener.name.<listener>.<mechanism>.sasl.server.callback.handler.class; "
                                          f"{_SASL_AT_START}.",
    "sasl.server.max.receive.size": f"The largest frame a client may send before it is authenticated (larger: the "
                                    f"authentication fails); {_SASL_AT_START}.",
    "connections.max.reauth.ms": f"KIP-368 session lifetime of SASL connections (0: none), also per listener and "
                                 f"mechanism; sent in SaslAuthenticate v1+, the client re-authenticates before it "
                                 f"ends, a request on an expired session closes the connection; {_SASL_AT_START}.",
    "connection.failed.authentication.delay.ms": f"How long the answer to a failed SASL authentication is held "
                                                 f"before the connection closes (other clients are served "
                                                 f"meanwhile); must be less than connections.max.idle.ms (unless "
                                                 f"-1), as in Kafka; {_SASL_AT_START}.",
    "security.inter.broker.protocol": "The security protocol of the listener brokers use to reach each other when "
                                      "inter.broker.listener.name is not set (the listener of that name; PLAINTEXT "
                                      "by default), as in Kafka (security/inter_broker.py).",
    "sasl.mechanism.inter.broker.protocol": "The SASL mechanism a broker's own client uses on a SASL inter-broker "
                                            "listener (PLAIN, SCRAM-SHA-256/512; Kafka's default GSSAPI is refused "
                                            "there), as in Kafka (security/inter_broker.py).",
    **{name: f"The signed-JWT validator of OAUTHBEARER (security/sasl/oauthbearer.py); {_SASL_AT_START}." for name in (
        "sasl.oauthbearer.jwks.endpoint.url", "sasl.oauthbearer.clock.skew.seconds",
        "sasl.oauthbearer.expected.audience", "sasl.oauthbearer.expected.issuer",
        "sasl.oauthbearer.scope.claim.name", "sasl.oauthbearer.sub.claim.name",
        "sasl.oauthbearer.jwks.endpoint.refresh.ms", "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
        "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms")},
})
# Kafka checks these where KafkaConfig reads them, not in its ConfigDef (their catalogue column is empty).
_READ_CHECKS: dict[str, Validator] = {"max.connections.per.ip.overrides": ConnectionsPerIpOverrides()}
BROKER_CONFIGS.update(
    (name, ConfigDef(name, type_, _kafka_default(type_, default), _USED_KAFKA_DOCS.get(name) or _unused_doc(name, mode),
                     _READ_CHECKS.get(name) or _kafka_validator(type_, valid),
                     read_only=name not in DYNAMIC_BROKER_CONFIG_NAMES, sensitive=type_ == "password"))
    for name, type_, default, valid, mode in KAFKA_BROKER_CONFIGS
    if name not in BROKER_CONFIGS
)

# Kafka's listener overrides (DynamicBrokerConfig.ListenerConfigRegex): listener.name.<listener>.<config> sets
# <config> for one listener. AlterConfigs accepts them (typed as their base config; per broker, except the
# cluster-level listener configs); DescribeConfigs lists those set, read-only, with their base as synonym.
_LISTENER_OVERRIDE = re.compile(r"listener\.name\.[^.]*\.(.*)")
CLUSTER_LEVEL_LISTENER_CONFIGS = frozenset({"max.connections", "max.connection.creation.rate"})
# Kafka's DynamicBrokerConfig.ListenerMechanismConfigs: set per listener and SASL mechanism,
# listener.name.<listener>.<mechanism>.<config> (listener.name.sasl_plaintext.plain.sasl.jaas.config).
LISTENER_MECHANISM_CONFIGS = ("sasl.jaas.config", "sasl.login.callback.handler.class", "sasl.login.class",
                              "sasl.server.callback.handler.class", "connections.max.reauth.ms")


def listener_prefix(listener: str) -> str:
    """The prefix of ``listener``'s overrides: ``listener.name.<listener, lower case>.``"""
    return f"listener.name.{listener.lower()}."


def listener_override_base(name: str) -> str | None:
    """The base config a ``listener.name.<listener>.<config>`` or
    ``listener.name.<listener>.<mechanism>.<config>`` name overrides, or None."""
    match = _LISTENER_OVERRIDE.fullmatch(name)
    if not match:
        return None
    rest = match[1]
    mechanism, dot, config = rest.partition(".")
    if rest not in LISTENER_MECHANISM_CONFIGS and dot and config in LISTENER_MECHANISM_CONFIGS:
        return config  # the mechanism (PLAIN, SCRAM-SHA-256, ...) holds no dot
    return rest


def broker_config_def(name: str) -> ConfigDef | None:
    """The ConfigDef of a broker config name (a listener override's is its base's, under its own name, with
    no default and read-only as Kafka describes it), or None for a name pykbroker does not know."""
    definition = BROKER_CONFIGS.get(name)
    if definition is not None:
        return definition
    base = BROKER_CONFIGS.get(listener_override_base(name) or "")
    if base is None:
        return None
    effect = ("the listener's TLS context (and the inter-broker client's) is rebuilt with it when it changes, "
              "as Kafka's SslFactory" if base.name.startswith("ssl.") else "no effect here")
    return replace(base, name=name, default=None, read_only=True,
                   doc=f"{base.name} for one listener (Kafka's listener override); {effect}.")

_TOPIC_CONFIG_DEFS = (
    ConfigDef("cleanup.policy", "list", ["delete"], "delete old segments and/or compact by key.", _CLEANUP_POLICIES, ("log.cleanup.policy",)),
    ConfigDef(
        "compression.type",
        "string",
        "producer",
        "Final compression of the topic's data; producer keeps the producer's codec.",
        _COMPRESSION_TYPES,
        ("compression.type",),
    ),
    ConfigDef(
        "delete.retention.ms", "long", 86400000, "How long tombstones are kept.", _AT_LEAST_0, ("log.cleaner.delete.retention.ms",)
    ),
    ConfigDef(
        "file.delete.delay.ms",
        "long",
        60000,
        "Accepted for Kafka compatibility; segment files being sent stay open until sent, whatever the delay.",
        _AT_LEAST_0,
        ("log.segment.delete.delay.ms",),
    ),
    ConfigDef(
        "flush.messages", "long", LONG_MAX, "fsync after this many unflushed messages.", _AT_LEAST_1, ("log.flush.interval.messages",)
    ),
    ConfigDef(
        "flush.ms",
        "long",
        LONG_MAX,
        "fsync at least this often.",
        _AT_LEAST_0,
        ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
    ),
    ConfigDef("follower.replication.throttled.replicas", "list", [], "Replicas throttled on the follower side.", ThrottledReplicas()),
    ConfigDef(
        "index.interval.bytes", "int", 4096, "Bytes of log between two offset index entries.", _AT_LEAST_0, ("log.index.interval.bytes",)
    ),
    ConfigDef("leader.replication.throttled.replicas", "list", [], "Replicas throttled on the leader side.", ThrottledReplicas()),
    ConfigDef(
        "local.retention.bytes", "long", -2, "Local retention with tiered storage.", Range(-2), ("log.local.retention.bytes",)
    ),
    ConfigDef("local.retention.ms", "long", -2, "Local retention with tiered storage.", Range(-2), ("log.local.retention.ms",)),
    ConfigDef(
        "max.compaction.lag.ms",
        "long",
        LONG_MAX,
        "Maximum age of a record before compaction.",
        _AT_LEAST_1,
        ("log.cleaner.max.compaction.lag.ms",),
    ),
    ConfigDef("max.message.bytes", "int", 1048588, "Largest record batch the topic accepts.", _AT_LEAST_0, ("message.max.bytes",)),
    ConfigDef(
        "message.downconversion.enable",
        "boolean",
        True,
        "Allow down-conversion for old fetch versions; no effect here: pykbroker serves Fetch v4 and later, "
        "which never down-convert.",
        None,
        ("log.message.downconversion.enable",),
    ),
    ConfigDef(
        "message.format.version",
        "string",
        "3.0-IV1",
        "Deprecated: any version Kafka 3.7.1 knows is accepted, stored and described, with no effect (as Kafka with "
        "inter.broker.protocol.version 3.0 or later; one older than 0.11 is logged as ignored): batches are v2.",
        _MESSAGE_FORMAT_VERSION,
        ("log.message.format.version",),
    ),
    ConfigDef(
        "message.timestamp.after.max.ms",
        "long",
        LONG_MAX,
        "How far in the future a record's timestamp may be.",
        _AT_LEAST_0,
        ("log.message.timestamp.after.max.ms",),
    ),
    ConfigDef(
        "message.timestamp.before.max.ms",
        "long",
        LONG_MAX,
        "How far in the past a record's timestamp may be.",
        _AT_LEAST_0,
        ("log.message.timestamp.before.max.ms",),
    ),
    ConfigDef(
        "message.timestamp.difference.max.ms",
        "long",
        LONG_MAX,
        "Deprecated: how far a record's timestamp may be from the broker's clock, either way; as in Kafka 3.7, "
        "it applies where message.timestamp.before.max.ms / message.timestamp.after.max.ms are left at their default.",
        _AT_LEAST_0,
        ("log.message.timestamp.difference.max.ms",),
    ),
    ConfigDef(
        "message.timestamp.type",
        "string",
        "CreateTime",
        "CreateTime keeps the producer's timestamp; LogAppendTime stamps the broker's clock.",
        _TIMESTAMP_TYPES,
        ("log.message.timestamp.type",),
    ),
    ConfigDef(
        "min.cleanable.dirty.ratio",
        "double",
        0.5,
        "Dirty ratio that makes the log eligible for cleaning.",
        Range(0, 1),
        ("log.cleaner.min.cleanable.ratio",),
    ),
    ConfigDef(
        "min.compaction.lag.ms",
        "long",
        0,
        "Minimum age of a record before compaction.",
        _AT_LEAST_0,
        ("log.cleaner.min.compaction.lag.ms",),
    ),
    ConfigDef("min.insync.replicas", "int", 1, "Minimum in-sync replicas for an acks=all write.", _AT_LEAST_1, ("min.insync.replicas",)),
    ConfigDef("preallocate", "boolean", False, "Preallocate segment files.", None, ("log.preallocate",)),
    ConfigDef("remote.storage.enable", "boolean", False, "Tiered storage for this topic."),
    ConfigDef("retention.bytes", "long", -1, "Delete old segments beyond this partition size (-1: no limit).", None, ("log.retention.bytes",)),
    ConfigDef(
        "retention.ms",
        "long",
        604800000,
        "Delete segments older than this (-1: never).",
        Range(-1),
        ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
    ),
    ConfigDef("segment.bytes", "int", 1073741824, "Maximum size of one segment file.", _MIN_SEGMENT_BYTES, ("log.segment.bytes",)),
    ConfigDef(
        "segment.index.bytes", "int", 10485760, "Maximum size of a segment's offset index.", Range(4), ("log.index.size.max.bytes",)
    ),
    ConfigDef(
        "segment.jitter.ms",
        "long",
        0,
        "Random jitter subtracted from segment.ms.",
        _AT_LEAST_0,
        ("log.roll.jitter.ms", "log.roll.jitter.hours"),
    ),
    ConfigDef("segment.ms", "long", 604800000, "Roll a segment after this long.", _AT_LEAST_1, ("log.roll.ms", "log.roll.hours")),
    ConfigDef(
        "unclean.leader.election.enable",
        "boolean",
        False,
        "Allow a replica outside the ISR to become leader.",
        None,
        ("unclean.leader.election.enable",),
    ),
)
# The 31 topic configs Kafka 3.7.1 lists for a topic, in its (alphabetical) order.
TOPIC_CONFIGS: dict[str, ConfigDef] = _table(*_TOPIC_CONFIG_DEFS)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FSYNC_MODES = ("always", "interval", "never")
_PORT = Range(0, 65535)

# pykbroker's own settings (not Kafka keys); BrokerConfig has a field for each.
PYKBROKER_SETTINGS: dict[str, ConfigDef] = _table(
    ConfigDef("host", "string", "127.0.0.1", "Address to listen on."),
    ConfigDef("port", "int", 9092, "Port to listen on (0: any free port).", _PORT),
    ConfigDef("advertised.host", "string", None, "Host clients are told to connect to; default: host (the canonical host name for a wildcard)."),
    ConfigDef("advertised.port", "int", None, "Port clients are told to connect to; default: port.", _PORT),
    ConfigDef("data.dir", "string", "./data", "Directory holding the partition logs (Kafka's log.dirs, one directory)."),
    ConfigDef("log.level", "string", "INFO", "Python logging level.", OneOf(LOG_LEVELS)),
    ConfigDef("fsync", "string", "interval", "When the log is fsynced: every write, every log.flush.interval.ms, or never.", OneOf(FSYNC_MODES)),
)

# Kafka names for pykbroker settings; within one source the later name wins (log.dirs beats log.dir, as in Kafka).
_SETTING_ALIASES = {"log.dir": "data.dir", "log.dirs": "data.dir"}
_FSYNC_FLUSH_DEFAULTS: dict[str, dict[str, Any]] = {
    "always": {"log.flush.interval.messages": 1},
    "interval": {"log.flush.interval.ms": 1000},
    "never": {},
}
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")
ENV_PREFIX = "PYKBROKER_"
ENV_CONFIG_FILE = "PYKBROKER_CONFIG"


def _check_queued_max_request_bytes(values: Mapping[str, Any]) -> None:
    """Kafka's KafkaConfig rule: queued.max.request.bytes <= 0 (unbounded) or >= socket.request.max.bytes, so
    that the largest request the broker accepts can always be received."""
    queued = int(values["queued.max.request.bytes"])
    largest = int(values["socket.request.max.bytes"])
    if 0 < queued < largest:
        raise ConfigError("queued.max.request.bytes", f"queued.max.request.bytes ({queued}) must be <= 0 (unbounded) "
                          f"or at least socket.request.max.bytes ({largest})")


def _check_failed_authentication_delay(values: Mapping[str, Any]) -> None:
    """Kafka's KafkaConfig rule: with idle connections closed (connections.max.idle.ms >= 0), a failed
    authentication's delayed answer must come before the idle close."""
    delay = int(values["connection.failed.authentication.delay.ms"])
    idle = int(values["connections.max.idle.ms"])
    if idle >= 0 and not delay < idle:
        raise KafkaRequirement("connection.failed.authentication.delay.ms",
                               f"connection.failed.authentication.delay.ms={delay} should always be less than "
                               f"connections.max.idle.ms={idle} to prevent failed authentication responses from "
                               f"timing out")


MIN_DEDUPE_BUFFER_PER_THREAD = 1024 * 1024


class KafkaRequirement(ConfigError):
    """A requirement of Kafka's KafkaConfig, in its words (Kafka answers "requirement failed: <message>")."""


class ReconfigurationError(ConfigError):
    """A dynamic update a broker component refuses given its current value (Kafka's
    Reconfigurable.validateReconfiguration: the log cleaner's and the thread pools' thread counts)."""


def check_cleaner_configs(values: Mapping[str, Any], current: Mapping[str, Any] | None = None) -> None:
    """Kafka's rules for the log cleaner's broker configs (KafkaConfig.validateValues): more than 1 MiB of
    log.cleaner.dedupe.buffer.size per cleaner thread (ConfigError); and, on a dynamic update from
    ``current`` (Kafka's LogCleaner.validateReconfiguration), log.cleaner.threads at least 1, at least half
    and at most double the current number (ReconfigurationError)."""
    threads = int(values["log.cleaner.threads"])
    dedupe = int(values["log.cleaner.dedupe.buffer.size"])
    if threads >= 1 and dedupe // threads <= MIN_DEDUPE_BUFFER_PER_THREAD:
        raise KafkaRequirement("log.cleaner.dedupe.buffer.size",
                               "log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread.")
    if current is None:
        return
    now = int(current["log.cleaner.threads"])
    if threads == now:
        return
    if threads < 1:
        raise ReconfigurationError("log.cleaner.threads", "Log cleaner threads should be at least 1")
    if now < 1:  # the cleaner was off: any number from 1
        return
    if threads < now // 2:
        raise ReconfigurationError("log.cleaner.threads",
                                   f"Log cleaner threads cannot be reduced to less than half the current value {now}")
    if threads > now * 2:
        raise ReconfigurationError("log.cleaner.threads",
                                   f"Log cleaner threads cannot be increased to more than double the current value {now}")


# Kafka's DynamicThreadPool.ReconfigurableConfigs (no effect here: one event loop serves every connection, and
# the follower fetcher runs one task per leader; but a change is checked as Kafka checks it).
THREAD_POOL_CONFIG_NAMES = ("num.io.threads", "num.network.threads", "num.replica.fetchers",
                            "num.recovery.threads.per.data.dir", "background.threads")


def check_thread_pool_configs(values: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Kafka's DynamicThreadPool.validateReconfiguration: a thread count that changes goes to at least 1, at
    least half and at most double its current value. Raises ReconfigurationError in Kafka's words."""
    for name in THREAD_POOL_CONFIG_NAMES:
        new, now = int(values[name]), int(current[name])
        if new == now:
            continue
        failed = f"Dynamic thread count update validation failed for {name}={new}"
        if new <= 0:
            raise ReconfigurationError(name, f"{failed}, value should be at least 1")
        if new < now // 2:
            raise ReconfigurationError(name, f"{failed}, value should be at least half the current value {now}")
        if new > now * 2:
            raise ReconfigurationError(name, f"{failed}, value should not be greater than double the current value {now}")


# ---------------------------------------------------------------------------------------------------
# The resolved configuration.


@dataclass(frozen=True)
class BrokerConfig:
    """The broker's whole configuration, typed. Build it with ``load_config``; constructing it directly
    (tests) fills every key not given in ``values`` with its default.

    ``values`` holds every BROKER_CONFIGS key; ``explicit`` the keys the user set (DescribeConfigs reports
    those as STATIC_BROKER_CONFIG, the rest as DEFAULT_CONFIG). ``dynamic_broker`` and ``dynamic_default``
    are the typed dynamic configs of this broker and of the cluster-wide default (AlterConfigs; see
    cluster/dynamic_configs.py, which builds this broker's current config with ``with_dynamic``): they
    win over the static values, this broker's over the default, in ``values`` and in every topic default;
    ``static_values`` is ``values`` without them. ``advertised_host`` "" and
    ``advertised_port`` 0 mean "derive from host and port". ``listeners`` and ``advertised_listeners``
    are derived (see resolve_listeners); afterwards host, port and the advertised pair are the first
    listener's.
    """

    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str = ""
    broker_id: int = 1
    data_dir: Path = Path("data")
    log_level: str = "INFO"
    fsync: str = "interval"
    values: Mapping[str, Any] = field(default_factory=dict)
    explicit: frozenset[str] = frozenset()
    advertised_port: int = 0
    listeners: tuple["Listener", ...] = ()
    advertised_listeners: tuple["Listener", ...] = ()
    dynamic_broker: Mapping[str, Any] = field(default_factory=dict)
    dynamic_default: Mapping[str, Any] = field(default_factory=dict)
    static_values: Mapping[str, Any] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_MODES:
            raise ConfigError("fsync", f"Invalid value {self.fsync!r} for configuration fsync: String must be one of: {', '.join(FSYNC_MODES)}")
        full = {name: definition.default for name, definition in BROKER_CONFIGS.items()}
        full.update(_FSYNC_FLUSH_DEFAULTS[self.fsync])
        if self.values.get("zookeeper.connect"):
            full.update(CLUSTER_DEFAULTS)  # a cluster member takes Kafka's defaults where the single node's differ
        full.update(self.values)
        full["broker.id"] = full["node.id"] = self.broker_id  # synonyms, as Kafka's KafkaConfig.populateSynonyms
        full["log.dirs"] = os.fspath(self.data_dir)  # Kafka's name for pykbroker's data.dir, as DescribeConfigs shows it
        # A frozen dataclass: fill the derived fields once, here, so every construction path agrees.
        object.__setattr__(self, "static_values", MappingProxyType(dict(full)))
        object.__setattr__(self, "dynamic_broker", MappingProxyType(dict(self.dynamic_broker)))
        object.__setattr__(self, "dynamic_default", MappingProxyType(dict(self.dynamic_default)))
        full.update(self.dynamic_default)
        full.update(self.dynamic_broker)
        object.__setattr__(self, "values", MappingProxyType(full))
        _check_queued_max_request_bytes(full)
        _check_failed_authentication_delay(full)
        object.__setattr__(self, "explicit", frozenset(self.explicit))
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if not self.listeners:
            listeners, advertised = resolve_listeners(self.host, self.port, self.advertised_host, self.advertised_port, full,
                                                      explicit=self.explicit)
            object.__setattr__(self, "listeners", listeners)
            object.__setattr__(self, "advertised_listeners", advertised)
        # host/port and their advertised twins name the first listener (the only one unless `listeners` is set).
        object.__setattr__(self, "host", self.listeners[0].host)
        object.__setattr__(self, "port", self.listeners[0].port)
        object.__setattr__(self, "advertised_host", self.advertised_listeners[0].host)
        object.__setattr__(self, "advertised_port", self.advertised_listeners[0].port)

    def get(self, name: str) -> Any:
        """The typed value of a broker config key."""
        try:
            return self.values[name]
        except KeyError:
            raise KeyError(f"unknown broker config {name!r}") from None

    @property
    def inter_broker_listener(self) -> "Listener | None":
        """The advertised listener brokers reach each other on (Kafka's rule: inter_broker_listener_name)."""
        name = inter_broker_listener_name(self.values)[0]
        return next((listener for listener in self.advertised_listeners if listener.name == name), None)

    @property
    def zookeeper_connect(self) -> str | None:
        """The ZooKeeper connection string, or None for the embedded single-node metadata."""
        return self.values["zookeeper.connect"] or None

    def with_dynamic(self, dynamic_broker: Mapping[str, Any], dynamic_default: Mapping[str, Any]) -> "BrokerConfig":
        """This configuration with these dynamic configs (typed, validated) in place of its own."""
        return replace(self, values=self.static_values, dynamic_broker=dynamic_broker, dynamic_default=dynamic_default)

    def broker_config_source(self, name: str) -> tuple[Any, ConfigSource]:
        """A broker key's value and its DescribeConfigs source."""
        if name in self.dynamic_broker:
            source = ConfigSource.DYNAMIC_BROKER_CONFIG
        elif name in self.dynamic_default:
            source = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG
        else:
            source = ConfigSource.STATIC_BROKER_CONFIG if name in self.explicit else ConfigSource.DEFAULT_CONFIG
        return self.get(name), source

    def broker_config_synonyms(self, name: str, *, per_broker: bool = True) -> list[tuple[str, str | None, ConfigSource]]:
        """Kafka's synonyms of a broker key for DescribeConfigs (ConfigHelper.configSynonyms): every key of
        its synonym group (``log.retention.ms``/``.minutes``/``.hours``) that has a value, layer by layer
        (this broker's dynamic configs, the cluster default's, the static ones, the defaults), without
        the entries before the key's own first one; ``per_broker`` False (the cluster-default resource)
        keeps only the cluster default's entries. The first entry is the key's source."""
        definition = broker_config_def(name)
        defaults = {key: _FSYNC_FLUSH_DEFAULTS[self.fsync].get(key, broker_config_def(key).default) for key in _broker_synonym_group(name)}
        layers: list[tuple[Mapping[str, Any], ConfigSource]] = [
            (self.dynamic_broker, ConfigSource.DYNAMIC_BROKER_CONFIG),
            (self.dynamic_default, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
            ({key: self.static_values[key] for key in self.explicit if key in self.static_values}, ConfigSource.STATIC_BROKER_CONFIG),
            (defaults, ConfigSource.DEFAULT_CONFIG),
        ]
        if not per_broker:
            layers = [layers[1]]
        synonyms = [
            (key, broker_config_def(key).format(layer[key]), source)
            for layer, source in layers for key in _broker_synonym_group(name)
            if layer.get(key) is not None
        ]
        while synonyms and synonyms[0][0] != definition.name:
            synonyms.pop(0)
        return synonyms

    def topic_defaults(self) -> dict[str, Any]:
        """Every topic config's default on this broker, resolved through the broker synonyms, typed."""
        return {name: self._resolve_topic(name)[0] for name in TOPIC_CONFIGS}

    def topic_config_source(self, topic_key: str) -> tuple[Any, ConfigSource]:
        """A topic config's broker-level value and source for a topic without an override:
        STATIC_BROKER_CONFIG when a broker key the user set supplies it, else DEFAULT_CONFIG.

        This is what Kafka 3.7.1 reports in CreateTopics responses. Its DescribeConfigs looks only at
        the first synonym, so there a value supplied by ``log.retention.hours`` shows as DEFAULT_CONFIG.
        """
        value, supplier = self._resolve_topic(topic_key)
        if supplier is not None:
            return value, self.broker_config_source(supplier)[1]
        return value, ConfigSource.DEFAULT_CONFIG

    def topic_config_synonyms(self, topic_key: str) -> list[tuple[str, str | None, ConfigSource]]:
        """The broker synonyms of a topic config for DescribeConfigs ``include_synonyms``, as Kafka's
        ConfigHelper lists them: those of the first broker key that supplies it (``retention.ms`` <-
        ``log.retention.ms``; see ``broker_config_synonyms``, which drops the group's entries before that
        key's own: with only ``log.retention.hours`` set, none). Their head is the topic default's
        DescribeConfigs source (DEFAULT_CONFIG if there is none)."""
        synonyms = _topic_def(topic_key).synonyms
        return self.broker_config_synonyms(synonyms[0]) if synonyms else []

    def effective_topic_config(self, overrides: Mapping[str, str | None]) -> dict[str, Any]:
        """Every topic config for a topic with these (string) overrides, typed and validated."""
        return {**self.topic_defaults(), **validate_topic_configs(overrides)}

    def _resolve_topic(self, topic_key: str) -> tuple[Any, str | None]:
        """(value, the broker key that supplied it or None for the topic default)."""
        definition = _topic_def(topic_key)
        for name in definition.synonyms:
            value = self.values[name]
            if value is not None:
                return to_topic_unit(name, value), name
        return definition.default, None


def _broker_synonym_group(name: str) -> tuple[str, ...]:
    """The broker keys that are synonyms of ``name`` (Kafka's DynamicBrokerConfig.brokerConfigSynonyms:
    the keys supplying one topic config, ``log.retention.ms``/``.minutes``/``.hours``; a listener override
    and its base), or just ``name``."""
    base = listener_override_base(name)
    if base is not None and name not in BROKER_CONFIGS:
        return (name, base)
    for definition in TOPIC_CONFIGS.values():
        if name in definition.synonyms and len(definition.synonyms) > 1:
            return definition.synonyms
    return (name,)


def _topic_def(topic_key: str) -> ConfigDef:
    try:
        return TOPIC_CONFIGS[topic_key]
    except KeyError:
        raise KeyError(f"unknown topic config {topic_key!r}") from None


def to_topic_unit(broker_key: str, value: Any) -> Any:
    """A broker key's value as the topic config it supplies takes it (hours and minutes in ms; as Kafka's
    KafkaConfig.logRetentionTimeMillis, any negative retention means "forever", -1)."""
    factor = _SYNONYM_UNIT_MS.get(broker_key)
    if factor is None:
        return -1 if broker_key == "log.retention.ms" and value is not None and value < 0 else value
    # As Kafka: a negative hours/minutes value (log.retention.hours=-1) means "forever", i.e. -1 ms.
    return -1 if value < 0 else value * factor


# ---------------------------------------------------------------------------------------------------
# Listeners, as Kafka configures them: ``listeners`` and ``advertised.listeners`` are lists of
# ``NAME://host:port``, ``listener.security.protocol.map`` gives each name its security protocol.


DEFAULT_LISTENER_NAME = "PLAINTEXT"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# What pykbroker serves: all four (server/broker.py; security/tls.py for SSL, security/sasl/ for SASL).
SUPPORTED_SECURITY_PROTOCOLS = SECURITY_PROTOCOLS
# What a listener added by a dynamic update may use (listeners are not opened at run time with TLS contexts).
DYNAMIC_SECURITY_PROTOCOLS = ("PLAINTEXT",)
# Kafka's endpoint syntax (CoreUtils.listenerListToEndPoints): an IPv6 host may be bracketed.
_ENDPOINT = re.compile(r"(?P<name>[^:/]+)://\[?(?P<host>[0-9a-zA-Z\-%._:]*?)\]?:(?P<port>-?\d+)")
_NON_ROUTABLE = ("0.0.0.0", "::")


@dataclass(frozen=True)
class Listener:
    """One listener: ``name`` (upper case, as Kafka normalises it), ``host`` ("" or a wildcard binds every
    interface), ``port`` (0: any free port) and the security protocol its name maps to."""

    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"

    @property
    def binds_all(self) -> bool:
        return self.host in _WILDCARD_HOSTS

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.port}"


def canonical_host_name() -> str:
    """This machine's canonical (fully qualified) host name, which Kafka advertises for a listener that
    binds every interface (InetAddress.getLocalHost().getCanonicalHostName())."""
    return socket.getfqdn()


def parse_security_protocol_map(text: str) -> dict[str, str]:
    """``NAME:PROTOCOL,...`` -> {NAME: PROTOCOL}. Raises ConfigError naming the bad entry, in Kafka's words."""
    key = "listener.security.protocol.map"
    protocols: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, separator, protocol = item.partition(":")
        if not separator or not name.strip():
            raise ConfigError(key, f"Error parsing configuration property '{key}': {item}")
        if protocol.strip().upper() not in SECURITY_PROTOCOLS:
            raise ConfigError(key, f"Invalid security protocol `{protocol.strip()}` defined in {key}")
        protocols[name.strip().upper()] = protocol.strip().upper()
    return protocols


def parse_listeners(key: str, text: str, protocols: Mapping[str, str]) -> tuple[Listener, ...]:
    """Kafka's listener list ``NAME://host:port,...`` (``key`` names the setting in messages). Names must
    be unique and mapped to a protocol, ports unique (0 excepted). Raises ConfigError (KafkaRequirement for
    KafkaConfig's requirements), in Kafka's words where Kafka has some."""
    listeners: list[Listener] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = _ENDPOINT.fullmatch(item)
        if match is None:
            raise ConfigError(key, f"Error creating broker listeners from '{text}': Unable to parse {item} to a broker endpoint")
        name, host, port = match["name"].upper(), match["host"], int(match["port"])
        if not 0 <= port <= 65535:
            raise ConfigError(key, f"Invalid port {port} in {key} ({item}): must be 0-65535")
        if name not in protocols:
            raise ConfigError(key, f"Error creating broker listeners from '{text}': No security protocol defined for "
                              f"listener {name}")
        listeners.append(Listener(name, host, port, protocols[name]))
    if not listeners:
        raise ConfigError(key, f"{key} is empty: expected NAME://host:port,...")
    names = [listener.name for listener in listeners]
    if len(set(names)) != len(names):
        raise KafkaRequirement(key, f"Each listener must have a different name, {key}: {text}")
    ports = [listener.port for listener in listeners if listener.port]
    if key == "listeners" and len(set(ports)) != len(ports):
        raise KafkaRequirement(key, f"Each listener must have a different port, {key}: {text}")
    return tuple(listeners)


def check_listener_update(values: Mapping[str, Any], current: "BrokerConfig") -> None:
    """Kafka 3.7.1's checks of new listener configs (a dynamic update of listeners, advertised.listeners or
    listener.security.protocol.map) against this broker's ``current`` ones, in its words: ConfigError for
    configs that do not parse ("Error creating broker listeners from ..."), KafkaRequirement for KafkaConfig's
    requirements (resolve_listeners, the start-up checks), ReconfigurationError for DynamicListenerConfig's
    (an existing listener's security protocol cannot change). Unset listeners are pykbroker's host/port
    listener; the inter-broker listener must stay advertised."""
    listeners_text = values["listeners"] or ",".join(map(str, current.listeners))
    inter_broker = inter_broker_listener_name(values)[0]
    listeners, _ = resolve_listeners(current.host, current.port, current.advertised_host, current.advertised_port,
                                     {**values, "listeners": listeners_text, "inter.broker.listener.name": inter_broker},
                                     supported_only=False)
    for old in current.listeners:
        new = next((listener for listener in listeners if listener.name == old.name), None)
        if new is not None and new.security_protocol != old.security_protocol:
            raise ReconfigurationError("listener.security.protocol.map", "Security protocol cannot be updated for "
                                       f"existing listener ListenerName({old.name})")
    existing = {listener.name for listener in current.listeners}  # served already (SSL ones too)
    _check_supported([listener for listener in listeners if listener.name not in existing], DYNAMIC_SECURITY_PROTOCOLS)


def controller_listener_names(values: Mapping[str, Any]) -> frozenset[str]:
    """The names in controller.listener.names: KRaft controller listeners, which pykbroker neither opens nor
    advertises (it runs as a single node or in ZooKeeper mode)."""
    return frozenset(name.strip().upper() for name in (values.get("controller.listener.names") or "").split(",")
                     if name.strip())


def _check_supported(listeners: Iterable[Listener], supported: tuple[str, ...] = SUPPORTED_SECURITY_PROTOCOLS) -> None:
    for listener in listeners:
        if listener.security_protocol not in supported:
            raise ConfigError(
                "listeners",
                f"listener {listener} uses security protocol {listener.security_protocol}, which pykbroker does not "
                f"support yet (only {', '.join(supported)})",
            )


def inter_broker_listener_name(values: Mapping[str, Any], explicit: Iterable[str] = ()) -> tuple[str, str]:
    """(listener name, security protocol) of the inter-broker listener, as Kafka 3.7.1's
    KafkaConfig.interBrokerListenerNameAndSecurityProtocol: ``inter.broker.listener.name`` (upper case) with
    the protocol ``listener.security.protocol.map`` gives it, else the listener named after
    ``security.inter.broker.protocol`` (default PLAINTEXT). Both set (``explicit`` holds the keys the user
    set) is an error, as is a name the map does not know or an unknown protocol (Kafka's words)."""
    name = values.get("inter.broker.listener.name")
    if name:
        if "security.inter.broker.protocol" in set(explicit):
            raise ConfigError("inter.broker.listener.name", "Only one of inter.broker.listener.name and "
                              "security.inter.broker.protocol should be set.")
        name = str(name).strip().upper()
        protocols = parse_security_protocol_map(values.get("listener.security.protocol.map") or "")
        if name not in protocols:
            raise ConfigError("inter.broker.listener.name", f"Listener with name {name} defined in "
                              "inter.broker.listener.name not found in listener.security.protocol.map.")
        return name, protocols[name]
    protocol = str(values.get("security.inter.broker.protocol") or "PLAINTEXT").strip()
    if protocol.upper() not in SECURITY_PROTOCOLS:
        raise ConfigError("security.inter.broker.protocol", f"Invalid security protocol `{protocol}` defined in "
                          "security.inter.broker.protocol")
    return protocol.upper(), protocol.upper()


def resolve_listeners(
    host: str, port: int, advertised_host: str, advertised_port: int, values: Mapping[str, Any], *,
    supported_only: bool = True, explicit: Iterable[str] = (),
) -> tuple[tuple[Listener, ...], tuple[Listener, ...]]:
    """(listeners, advertised listeners) from Kafka's listener keys, else from pykbroker's host/port.

    ``listeners`` wins over host/port (as it did over Kafka's old ``host.name``/``port``). Advertised
    listeners default to the listeners; their names must be a subset of the listeners' and, as in Kafka,
    they may not name the non-routable 0.0.0.0. A listener on every interface (an empty host, or
    ``--host 0.0.0.0`` without an advertised host) is advertised under the canonical host name. Kafka's own
    requirements (the inter-broker listener's among them: inter_broker_listener_name) are checked here, before
    anything starts; then a security protocol pykbroker does not serve (``supported_only`` False: not checked).
    Kafka's requirements raise KafkaRequirement.
    """
    protocols = parse_security_protocol_map(values["listener.security.protocol.map"])
    if values.get("listeners"):
        every = parse_listeners("listeners", values["listeners"], protocols)
        controllers = controller_listener_names(values)
        listeners = tuple(listener for listener in every if listener.name not in controllers)
        if not listeners:
            raise ConfigError("listeners", f"every listener in listeners ({values['listeners']}) is a KRaft controller "
                              "listener (controller.listener.names), which pykbroker does not serve")
    else:
        listeners = (Listener(DEFAULT_LISTENER_NAME, host, port, protocols.get(DEFAULT_LISTENER_NAME, "PLAINTEXT")),)
    if values.get("advertised.listeners"):
        advertised = parse_listeners("advertised.listeners", values["advertised.listeners"], protocols)
    elif values.get("listeners"):
        advertised = listeners
    else:
        advertised = (Listener(listeners[0].name, advertised_host or host, advertised_port or port, listeners[0].security_protocol),)
    # KafkaConfig's requirements, in its order and words
    advertised_names = ",".join(listener.name for listener in advertised)
    inter_broker, _ = inter_broker_listener_name(values, explicit)
    if inter_broker not in {listener.name for listener in advertised}:
        raise KafkaRequirement("inter.broker.listener.name", "inter.broker.listener.name must be a listener name "
                               "defined in advertised.listeners. The valid options based on currently configured "
                               f"listeners are {advertised_names}")
    defined = every if values.get("listeners") else listeners
    if {a.name for a in advertised} - {listener.name for listener in defined}:
        raise KafkaRequirement("advertised.listeners", "advertised.listeners listener names must be equal to or a "
                               f"subset of the ones defined in listeners. Found {advertised_names}. The valid options "
                               f"based on the current configuration are {','.join(l.name for l in defined)}")
    if values.get("listeners") or values.get("advertised.listeners"):
        for listener in advertised:
            if listener.host in _NON_ROUTABLE:
                raise KafkaRequirement("advertised.listeners", "advertised.listeners cannot use the nonroutable "
                                       f"meta-address {listener.host}. Use a routable IP address.")
    if supported_only:
        _check_supported(listeners)  # the inter-broker listener among them: the broker's client speaks every protocol
    if any(listener.binds_all for listener in advertised):
        host_name = canonical_host_name()
        advertised = tuple(replace(a, host=host_name) if a.binds_all else a for a in advertised)
    return listeners, advertised



# ---------------------------------------------------------------------------------------------------
# Topic config validation for CreateTopics, AlterConfigs and IncrementalAlterConfigs.


def validate_topic_configs(configs: Mapping[str, str | None]) -> dict[str, Any]:
    """Parse and validate topic config overrides. Raises ConfigError (Kafka answers INVALID_CONFIG,
    with the error's message) for an unknown key, a null value or an invalid value."""
    typed: dict[str, Any] = {}
    for name, raw in configs.items():
        if name not in TOPIC_CONFIGS:
            raise ConfigError(name, f"Unknown topic config name: {name}")
        if raw is None:
            raise ConfigError(name, f"Null value not supported for topic configs: {name}")
        typed[name] = TOPIC_CONFIGS[name].parse(raw, kafka_wording=True)
    min_lag = typed.get("min.compaction.lag.ms", TOPIC_CONFIGS["min.compaction.lag.ms"].default)
    max_lag = typed.get("max.compaction.lag.ms", TOPIC_CONFIGS["max.compaction.lag.ms"].default)
    if min_lag > max_lag:
        raise ConfigError(
            "min.compaction.lag.ms",
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > max.compaction.lag.ms ({max_lag})",
        )
    return typed


def warn_ignored_topic_configs(topic: str, configs: Mapping[str, Any], inter_broker_protocol_version: str) -> None:
    """Kafka 3.7.1's warning (TopicConfigHandler) when a topic's new configs set a message.format.version
    older than 0.11.0 (record versions before v2): with inter.broker.protocol.version 3.0-IV1 or later it is
    ignored; an older one would make Kafka write old records, pykbroker writes every batch in v2 still, and
    says so instead."""
    version = configs.get("message.format.version")
    if version and re.match(r"0\.(8|9|10)(\.|$)", str(version)):
        if not ignores_message_format_version(inter_broker_protocol_version):
            log.warning("Topic configuration message.format.version with value `%s` for `%s` has no effect: pykbroker "
                        "writes record batches v2 whatever inter.broker.protocol.version (`%s`) says.", version, topic,
                        inter_broker_protocol_version)
            return
        log.warning("Topic configuration message.format.version with value `%s` is ignored for `%s` because the "
                    "inter-broker protocol version `%s` is greater or equal than 3.0. This configuration is "
                    "deprecated and it will be removed in Apache Kafka 4.0.", version, topic, inter_broker_protocol_version)


# ---------------------------------------------------------------------------------------------------
# Loading: sources -> one BrokerConfig.


@dataclass(frozen=True)
class _Setting:
    raw: Any
    origin: str  # where the value came from, for messages: "--port", "PYKBROKER_PORT", "broker.toml"
    key: str = ""  # the name it was set by (log.dir, log.dirs for data.dir)


def load_config(
    *,
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] = os.environ,
    file: Path | str | None = None,
) -> BrokerConfig:
    """Build the BrokerConfig from command-line values, environment and an optional config file.

    ``cli`` maps option names to values, None meaning "not given": pykbroker settings by their Python
    names (``host``, ``port``, ``data_dir``, ``advertised_host``, ``advertised_port``, ``broker_id``,
    ``log_level``, ``fsync``, ``config``) and Kafka keys by their dotted names (``"num.partitions": 3``,
    from ``--override``). The file is ``file``, else ``cli["config"]``, else ``$PYKBROKER_CONFIG``.
    Raises ConfigError.
    """
    cli = dict(cli or {})
    config_file = file or cli.pop("config", None) or env.get(ENV_CONFIG_FILE)
    cli.pop("config", None)

    layers: list[dict[str, _Setting]] = []  # lowest precedence first
    if config_file:
        path = Path(config_file)
        layers.append(_layer((key, value, str(path)) for key, value in read_config_file(path)))
    layers.append(_layer((_env_key(name), value, name) for name, value in env.items() if _env_setting(name)))
    layers.append(
        _layer(
            (key if "." in key else key.replace("_", "."), value, _flag_name(key))
            for key, value in cli.items()
            if value is not None
        )
    )
    merged: dict[str, _Setting] = {}
    for layer in layers:
        merged.update(layer)

    for kafka_key, own_keys in (("listeners", ("host", "port")), ("advertised.listeners", ("advertised.host", "advertised.port"))):
        overridden = [f"{key} ({merged[key].origin})" for key in own_keys if key in merged and kafka_key in merged]
        if overridden:
            log.warning("%s (from %s) is set, so %s %s ignored, as Kafka ignores its old host.name and port",
                        kafka_key, merged[kafka_key].origin, " and ".join(overridden), "is" if len(overridden) == 1 else "are")
    if "node.id" in merged and "broker.id" not in merged:  # Kafka's populateSynonyms: node.id gives broker.id
        merged["broker.id"] = merged["node.id"]
    settings = {name: _parse(definition, merged.get(name)) for name, definition in PYKBROKER_SETTINGS.items()}
    values = {name: _parse(definition, merged[name]) for name, definition in BROKER_CONFIGS.items() if name in merged}
    values.update((name, _parse(broker_config_def(name), setting)) for name, setting in merged.items()
                  if name not in BROKER_CONFIGS and name not in PYKBROKER_SETTINGS)  # listener overrides
    if values.get("node.id", values.get("broker.id")) != values.get("broker.id"):
        raise ConfigError("node.id", "You must set `node.id` to the same value as `broker.id`. "
                          f"(node.id {values['node.id']} from {merged['node.id'].origin}, "
                          f"broker.id {values['broker.id']} from {merged['broker.id'].origin})")
    ibp = values.get("inter.broker.protocol.version")
    if ibp is not None and not ignores_message_format_version(ibp):
        log.warning("inter.broker.protocol.version %s (from %s) is older than 3.0-IV1; pykbroker behaves as Kafka 3.7 "
                    "with 3.7-IV4 whatever it says (record batches v2, Kafka 3.7's inter-broker request versions), "
                    "so it cannot take part in a rolling upgrade from older Kafka brokers", ibp,
                    merged["inter.broker.protocol.version"].origin)
    explicit = set(values)
    if "data.dir" in merged and merged["data.dir"].key != "log.dir":  # --data-dir, data.dir, log.dirs
        explicit.add("log.dirs")
    if "broker.id" in explicit:  # either name set both (Kafka's originals hold both after populateSynonyms)
        explicit.add("node.id")
    if "fsync" in merged:
        explicit.update(_FSYNC_FLUSH_DEFAULTS[settings["fsync"]])  # implied by a choice the user made
    check_cleaner_configs({**{n: d.default for n, d in BROKER_CONFIGS.items()}, **values})
    data_dir = settings["data.dir"]
    if "," in data_dir:
        raise ConfigError("data.dir", f"pykbroker uses one data directory, not a list: {data_dir!r} ({merged['data.dir'].origin})")
    return BrokerConfig(
        host=settings["host"],
        port=settings["port"],
        advertised_host=settings["advertised.host"] or "",
        broker_id=values.get("broker.id", BROKER_CONFIGS["broker.id"].default),
        data_dir=Path(data_dir).expanduser().absolute(),
        log_level=settings["log.level"],
        fsync=settings["fsync"],
        values=values,
        explicit=frozenset(explicit),
        advertised_port=settings["advertised.port"] or 0,
    )


def _layer(entries: Iterable[tuple[str, Any, str]]) -> dict[str, _Setting]:
    """One source's (key, raw value, origin) entries under canonical names; warns about keys pykbroker
    does not know, as Kafka does, rather than refusing to start."""
    layer: dict[str, _Setting] = {}
    for key, raw, origin in entries:
        name = _SETTING_ALIASES.get(key, key)
        if name in PYKBROKER_SETTINGS or broker_config_def(name) is not None:
            if name == "log.level" and isinstance(raw, str):  # logging's names are upper case; accept any case
                raw = raw.strip().upper()
            layer[name] = _Setting(raw, origin, key)
            if name != key and key in BROKER_CONFIGS:  # log.dir, log.dirs: also described under the name used
                layer[key] = _Setting(raw, origin, key)
        elif key in TOPIC_CONFIGS and TOPIC_CONFIGS[key].synonyms:
            log.warning(
                "configuration key %s (from %s) is a topic config and is ignored here; the broker-wide default is %s",
                key,
                origin,
                TOPIC_CONFIGS[key].synonyms[0],
            )
        else:
            log.warning("unknown configuration key %s (from %s) is ignored%s", key, origin,
                        _did_you_mean(key, _known_keys()))
    return layer


def _known_keys() -> list[str]:
    return [*PYKBROKER_SETTINGS, *BROKER_CONFIGS, *_SETTING_ALIASES]


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    """"; did you mean X?" for the known name ``name`` most resembles (a typo), else ""."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
    return f"; did you mean {close[0]}?" if close else ""


# PYKBROKER_* variables that are not settings: the config file's, and those of the tools and tests around the
# broker (a unit test checks that every PYKBROKER_ name in the tree is a setting or listed here).
ENV_NOT_SETTINGS = frozenset({
    ENV_CONFIG_FILE, "PYKBROKER_BROKERS", "PYKBROKER_CLEANER_CRASH_AT", "PYKBROKER_CONSOLE_SCREENSHOTS",
    "PYKBROKER_EOS_SEED", "PYKBROKER_FAULT_SEED", "PYKBROKER_FUZZ_FRAMES", "PYKBROKER_FUZZ_SECONDS",
    "PYKBROKER_FUZZ_SEED", "PYKBROKER_KAFKA_HOME", "PYKBROKER_PLUGIN_REPORT", "PYKBROKER_REFERENCE_CLUSTER",
    "PYKBROKER_SPARK_JARS", "PYKBROKER_SUMMARY", "PYKBROKER_TEST_LOG_LEVEL", "PYKBROKER_ZOOKEEPER_JAR",
})


def _env_setting(variable: str) -> bool:
    """Whether an environment variable sets a setting: PYKBROKER_ and a known key. A PYKBROKER_ variable
    that is neither a setting nor one of ENV_NOT_SETTINGS is a typo: warned about, with the variable it
    resembles."""
    if not variable.startswith(ENV_PREFIX) or variable in ENV_NOT_SETTINGS:
        return False
    key = _env_key(variable)
    if _SETTING_ALIASES.get(key, key) in PYKBROKER_SETTINGS or broker_config_def(key) is not None:
        return True
    known = {ENV_PREFIX + name.upper().replace(".", "_") for name in _known_keys()} | ENV_NOT_SETTINGS
    log.warning("environment variable %s names no pykbroker setting and is ignored%s", variable,
                _did_you_mean(variable, known))
    return False


def _parse(definition: ConfigDef, setting: _Setting | None) -> Any:
    if setting is None:
        return definition.default
    try:
        return definition.parse(setting.raw)
    except ConfigError as exc:
        raise ConfigError(exc.name, f"{exc.message}; set by {setting.origin}") from None


def _env_key(variable: str) -> str:
    """The key a PYKBROKER_ variable names: lower case with dots, in its own case when a known key has
    capitals (PYKBROKER_ZOOKEEPER_CLIENTCNXNSOCKET is zookeeper.clientCnxnSocket)."""
    key = variable[len(ENV_PREFIX) :].lower().replace("_", ".")
    return _MIXED_CASE_KEYS.get(key, key)


_MIXED_CASE_KEYS = {name.lower(): name for name in _known_keys() if name != name.lower()}


def _flag_name(cli_key: str) -> str:
    return f"--override {cli_key}" if "." in cli_key else "--" + cli_key.replace("_", "-")


# ---------------------------------------------------------------------------------------------------
# Config files.


def read_config_file(path: Path) -> list[tuple[str, Any]]:
    """The (key, raw value) pairs of a TOML (``*.toml``) or Kafka properties file. Raises ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(None, f"cannot read config file {path}: {exc.strerror or exc}") from None
    if path.suffix.lower() == ".toml":
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(None, f"config file {path} is not valid TOML: {exc}") from None
        pairs: dict[str, Any] = {}
        for key, value in _flatten_toml(document):
            if key in pairs:
                raise ConfigError(key, f"config file {path} sets {key} twice")
            pairs[key] = value
        return list(pairs.items())
    return list(parse_properties(text).items())


def _flatten_toml(table: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested tables join to the dotted name: ``[log] segment.bytes = 1`` is ``log.segment.bytes``."""
    for key, value in table.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            yield from _flatten_toml(value, name)
        else:
            yield name, value


_PROPERTY_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """Java ``.properties`` syntax, as Kafka reads server.properties: ``key=value``, ``key: value`` or
    ``key value``; ``#``/``!`` comments; a trailing backslash continues the line; backslash escapes.
    A repeated key keeps its last value."""
    result: dict[str, str] = {}
    for line in _logical_property_lines(text):
        key, value = _split_property(line)
        result[key] = value
    return result


def _logical_property_lines(text: str) -> Iterator[str]:
    pending = ""
    for physical in text.splitlines():
        stripped = physical.lstrip()
        if not pending and (not stripped or stripped[0] in "#!"):
            continue
        pending += stripped
        trailing = len(pending) - len(pending.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes escapes the line break
            pending = pending[:-1]
            continue
        yield pending
        pending = ""
    if pending:
        yield pending


def _split_property(line: str) -> tuple[str, str]:
    index = 0
    key_chars: list[str] = []
    while index < len(line):
        char = line[index]
        if char == "\\" and index + 1 < len(line):
            key_chars.append(_unescape_char(line[index + 1]))
            index += 2
            continue
        if char in "=: \t\f":
            break
        key_chars.append(char)
        index += 1
    rest = line[index:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return "".join(key_chars), _unescape(rest)


def _unescape(text: str) -> str:
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            if following == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[index + 2 : index + 6]):
                out.append(chr(int(text[index + 2 : index + 6], 16)))
                index += 6
                continue
            out.append(_unescape_char(following))
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _unescape_char(char: str) -> str:
    return _PROPERTY_ESCAPES.get(char, char)
