"""Building kio response entities for whichever API version the client asked for.

kio generates one dataclass per (API, version), with a field set that varies by version. Handlers write
one ``make(cls, **fields)`` call with every field any version knows; ``make`` keeps the ones this
version's class has, so a handler reads like the message spec instead of a ladder of version checks.
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import fields
from functools import lru_cache
from types import ModuleType
from typing import Any

from pykbroker.server.dispatch import RequestContext


_PLAIN, _TIMEDELTA, _DATETIME = 0, 1, 2


@lru_cache(maxsize=None)
def _field_kinds(cls: type) -> dict[str, int]:
    """Field name -> how kio wants the value: as is, as a timedelta (throttle times) or a datetime."""
    kinds = {}
    for f in fields(cls):
        kafka_type = f.metadata.get("kafka_type", "")
        kinds[f.name] = (
            _TIMEDELTA if kafka_type.startswith("timedelta") else _DATETIME if kafka_type.startswith("datetime") else _PLAIN
        )
    return kinds


def make(cls: type, **values: Any) -> Any:
    """Build ``cls`` from the given fields that it has; milliseconds become timedelta/datetime where kio wants."""
    kinds = _field_kinds(cls)
    kwargs = {}
    for name, value in values.items():
        kind = kinds.get(name)
        if kind is None:
            continue
        if kind and isinstance(value, int):
            if kind == _TIMEDELTA:
                value = datetime.timedelta(milliseconds=value)
            else:  # Kafka's -1 "no timestamp" is kio's None
                value = None if value < 0 else datetime.datetime.fromtimestamp(value / 1000, datetime.timezone.utc)
        kwargs[name] = value
    return cls(**kwargs)


def has_field(cls: type, name: str) -> bool:
    return name in _field_kinds(cls)


def response_module(ctx: RequestContext) -> ModuleType:
    """The kio module of this request's response version: its nested entity classes live there."""
    return sys.modules[ctx.request.codec.response_type.__module__]
