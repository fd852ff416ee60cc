"""The handler registry: one decorator both dispatches an API and proves the support matrix is honest.

Each module in server/handlers/ registers its functions with ``@handles(api_key)``. ``load_handlers``
imports the modules the matrix names and fails at start if an advertised API has no handler or a handler
serves an API the matrix does not advertise, so ApiVersions can never promise what we do not do.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Union

from pykbroker.config import DEFAULT_LISTENER_NAME
from pykbroker.protocol.apis import SUPPORTED_APIS
from pykbroker.protocol.framing import Request
from pykbroker.security.principal import ANONYMOUS, KafkaPrincipal

if TYPE_CHECKING:
    from pykbroker.server.broker import Broker


@dataclass(slots=True)
class RequestContext:
    broker: "Broker"
    request: Request
    peer: str
    listener: str = DEFAULT_LISTENER_NAME  # the name of the listener the request arrived on
    # Who sent it: the connection's authenticated principal (TLS client certificate or SASL), else
    # User:ANONYMOUS, as Kafka's RequestContext.principal. Handlers ask the authorizer with it.
    principal: KafkaPrincipal = ANONYMOUS
    size: int = 0  # the request's size in bytes, header and body (Kafka's sizeInBytes: the produce byte-rate quota)
    # Client quotas (server/throttling.py): the request's handler time and throttle; None while no quota is set.
    quota: Any = None
    # Set by the Produce handler when it returns a wait for the ISR with every record appended: the connection
    # may then take the Produce requests pipelined behind it (server/connection.py).
    appended: bool = False

    @property
    def version(self) -> int:
        return self.request.api_version


class NoResponse:
    """Returned by a handler when the protocol says the broker must not answer (Produce with acks=0)."""


NO_RESPONSE = NoResponse()


class CloseConnection:
    """Returned by a handler when the broker must answer by closing the connection (Produce with acks=0 that
    has an error: Kafka's KafkaApis.handleProduceRequest closes the connection so that the producer, which
    reads no answer, notices and refreshes its metadata). ``reason`` goes into the connection's log line."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


CLOSE_CONNECTION = CloseConnection("asked the broker to close the connection")

HandlerResult = Union[Any, Awaitable[Any], NoResponse, CloseConnection]
Handler = Callable[[RequestContext, Any], HandlerResult]

_HANDLERS: dict[int, Handler] = {}


def handles(api_key: int) -> Callable[[Handler], Handler]:
    def register(func: Handler) -> Handler:
        if api_key in _HANDLERS and _HANDLERS[api_key] is not func:
            raise RuntimeError(f"two handlers for api key {api_key}")
        _HANDLERS[api_key] = func
        return func

    return register


def load_handlers() -> dict[int, Handler]:
    for module in sorted({api.handler_module for api in SUPPORTED_APIS.values()}):
        importlib.import_module(f"pykbroker.server.handlers.{module}")
    missing = set(SUPPORTED_APIS) - set(_HANDLERS)
    extra = set(_HANDLERS) - set(SUPPORTED_APIS)
    if missing or extra:
        raise RuntimeError(f"support matrix and handlers disagree: no handler for {missing}, unadvertised {extra}")
    return dict(_HANDLERS)
