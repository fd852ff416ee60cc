"""The broker's own client on the inter-broker listener: how controller requests, follower fetches,
AlterPartition, controlled shutdown and transaction markers reach other brokers (Kafka 3.7's
ChannelBuilders.clientChannelBuilder for ``config.interBrokerListenerName``).

The inter-broker listener is Kafka's (``config.inter_broker_listener``: ``inter.broker.listener.name``, else the
listener named after ``security.inter.broker.protocol``). Its security protocol decides:

* PLAINTEXT: nothing (``security`` is None).
* SSL / SASL_SSL: TLS with that listener's view of the ``ssl.*`` settings (``listener.name.<l>.ssl.*`` wins,
  tls.listener_ssl_configs) in client mode: the trust store checks the other broker's certificate,
  ``ssl.endpoint.identification.algorithm`` (default https) checks that it names the host connected to
  (the other broker's advertised host), and the key store, when there is one, is presented as the client
  certificate (which ``ssl.client.auth=required`` on the listener asks for: mutual TLS). The context lives
  in a client-mode TlsContextHolder, reloaded with the listener's server one (tls.ListenerTlsReloader), as
  Kafka registers its inter-broker client channel builders as reconfigurable.
* SASL_PLAINTEXT / SASL_SSL: ``sasl.mechanism.inter.broker.protocol`` (Kafka's default GSSAPI is not
  spoken; PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 are) with the ``username`` / ``password`` of the listener's JAAS
  entry for it (sasl/client.py; checked on a 3-broker cluster with PLAIN and SCRAM-SHA-512 over
  SASL_PLAINTEXT, tests/cluster/test_inter_broker_sasl_cluster.py). A session lifetime the listener gives
  (KIP-368, ``connections.max.reauth.ms``) is honoured by moving to a new connection before it ends
  (protocol/client.py).

A setting that cannot work (a key store that does not load, no credentials) raises a ConfigError at
construction: the broker refuses to start, as Kafka does.
"""

from __future__ import annotations

import logging
from typing import Any

from pykbroker.config import BrokerConfig, ConfigError
from pykbroker.protocol.client import ClientSecurity

log = logging.getLogger(__name__)

__all__ = ("InterBrokerClient", "inter_broker_principal")

SASL_MECHANISM_INTER_BROKER = "sasl.mechanism.inter.broker.protocol"


class InterBrokerClient:
    """``security`` (a protocol/client.ClientSecurity, None for PLAINTEXT) for every NodeClients pool of the
    broker; ``tls`` the client-mode TlsContextHolder when the listener uses TLS; ``listener`` its name."""

    def __init__(self, listener: str, protocol: str, *, tls: Any = None, sasl: tuple[str, str, str] | None = None) -> None:
        self.listener = listener
        self.protocol = protocol
        self.tls = tls
        self.sasl_mechanism = sasl[0] if sasl else None
        if tls is None and sasl is None:
            self.security: ClientSecurity | None = None
            return
        make_sasl = None
        if sasl is not None:
            from pykbroker.security.sasl.client import sasl_client

            mechanism, username, password = sasl
            make_sasl = lambda: sasl_client(mechanism, username, password)  # noqa: E731
        self.security = ClientSecurity(
            ssl_context=(lambda: tls.context) if tls is not None else None, sasl=make_sasl,
            description=f"listener {listener} ({protocol}{'/' + sasl[0] if sasl else ''})")

    @classmethod
    def from_config(cls, config: BrokerConfig) -> "InterBrokerClient":
        from pykbroker.config import inter_broker_listener_name

        listener, protocol = inter_broker_listener_name(config.values)
        tls = sasl = None
        if protocol in ("SSL", "SASL_SSL"):
            from pykbroker.security.tls import TlsContextHolder, listener_ssl_configs

            try:
                tls = TlsContextHolder(listener_ssl_configs(config.values, listener, protocol), mode="client")
            except ConfigError as exc:
                raise ConfigError(exc.name, f"the inter-broker client on listener {listener}: {exc.message}") from None
        if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            sasl = _sasl_login(config, listener)
        return cls(listener, protocol, tls=tls, sasl=sasl)

    def __repr__(self) -> str:
        return f"InterBrokerClient({self.listener}, {self.protocol})"


def _sasl_login(config: BrokerConfig, listener: str) -> tuple[str, str, str]:
    """(mechanism, username, password) the broker logs in with on its SASL inter-broker listener; ConfigError
    naming the setting when they are missing."""
    from pykbroker.security.sasl.client import SaslClientError, inter_broker_credentials

    mechanism = str(config.get(SASL_MECHANISM_INTER_BROKER) or "GSSAPI")
    try:
        username, password = inter_broker_credentials(listener, mechanism, config.values)
    except SaslClientError as exc:
        raise ConfigError(SASL_MECHANISM_INTER_BROKER, str(exc)) from None
    return mechanism, username, password


def inter_broker_principal(config: BrokerConfig):
    """(principal, listener, protocol): the principal the broker's own requests carry on the inter-broker listener,
    as the other brokers' authorizers see it: User:ANONYMOUS on PLAINTEXT, User:<JAAS username> on SASL_PLAINTEXT
    and SASL_SSL; None on SSL (the key store certificate's mapped name: not known before the key store is read)
    and when the SASL login is missing (InterBrokerClient.from_config says what is wrong)."""
    from pykbroker.config import inter_broker_listener_name
    from pykbroker.security.principal import ANONYMOUS, USER_TYPE, KafkaPrincipal

    listener, protocol = inter_broker_listener_name(config.values)
    principal = None
    if protocol == "PLAINTEXT":
        principal = ANONYMOUS
    elif protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        try:
            principal = KafkaPrincipal(USER_TYPE, _sasl_login(config, listener)[1])
        except ConfigError:
            principal = None
    return principal, listener, protocol
