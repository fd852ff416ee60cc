"""Helpers for the ACL tests: a raw Kafka-protocol client over plain TCP or mutual TLS (a client certificate
gives the connection its principal), kio request building by API key and version, ACL creation through
CreateAcls, and a walker that turns any response into {entry path: error code}."""

from __future__ import annotations

import dataclasses
import socket
import ssl
import struct
import sys
import time

from kio.index import load_request_schema, load_response_from_request
from kio.serial import entity_reader

from broker_process import read_exact
from pykbroker.protocol.client import encode_request

# Kafka's codes for a refused authorization (what the tests compare; any other code means "allowed")
TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED = 29, 30, 31, 53
AUTH_CODES = frozenset({TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED})
SECURITY_DISABLED = 54
# AclOperation / ResourceType / PatternType / permission codes
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, ALL, DESCRIBE_CONFIGS = 3, 4, 5, 6, 7, 8, 2, 10
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
ALLOW, DENY = 3, 2


def schema(key: int, version: int):
    """(request class, its module) of an API version: the module holds the nested entity classes."""
    cls = load_request_schema(key, version)
    return cls, sys.modules[cls.__module__]


class RawClient:
    """One connection; ``call(request)`` sends a kio request and returns its decoded response."""

    def __init__(self, address: tuple[str, int], tls: ssl.SSLContext | None = None, timeout: float = 30.0) -> None:
        self.address, self.tls, self.timeout = address, tls, timeout
        self.sock: socket.socket | None = None
        self.correlation = 0

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=self.timeout)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_hostname=self.address[0])
        return sock

    def call(self, request):
        if self.sock is None:
            self.sock = self._connect()
        self.correlation += 1
        response_type = load_response_from_request(type(request))
        try:
            self.sock.sendall(encode_request(request, self.correlation, "acl-tests"))
            (size,) = struct.unpack(">i", read_exact(self.sock, 4))
            payload = read_exact(self.sock, size)
        except Exception:
            self.close()
            raise
        header, header_size = entity_reader(response_type.__header_schema__)(payload, 0)
        assert header.correlation_id == self.correlation
        response, _ = entity_reader(response_type)(payload, header_size)
        return response

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def client_tls(pki, pem_file: str | None = None) -> ssl.SSLContext:
    """A client TLS context trusting the test CA, presenting ``pem_file`` (key + chain) when given."""
    context = ssl.create_default_context(cafile=pki.ca_file)
    context.check_hostname = False
    if pem_file is not None:
        context.load_cert_chain(pem_file)
    return context


_IDS = ("name", "topic", "group_id", "key", "transactional_id", "resource_name", "partition_index", "partition",
        "index", "user")


def error_codes(response) -> dict[str, int]:
    """Every ``*error_code`` of a response, keyed by the path of entry names / indexes leading to it."""
    found: dict[str, int] = {}

    def walk(obj, path: tuple) -> None:
        ident = tuple(str(getattr(obj, f)) for f in _IDS if getattr(obj, f, None) is not None)
        path = path + ident
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name.endswith("error_code"):
                found["/".join(path) + ":" + f.name] = int(value)
            elif isinstance(value, tuple):
                for item in value:
                    if dataclasses.is_dataclass(item):
                        walk(item, path)
            elif dataclasses.is_dataclass(value):
                walk(value, path)

    walk(response, ())
    return found


def authorization_view(response) -> dict[str, int]:
    """error_codes with every code that is not an authorization failure shown as 0 ("allowed")."""
    return {path: (code if code in AUTH_CODES else 0) for path, code in error_codes(response).items()}


def acl_creation(principal: str, resource_type: int, name: str, operation: int, permission: int = ALLOW,
                 pattern: int = LITERAL, host: str = "*"):
    _, m = schema(30, 3)
    return m.AclCreation(resource_type=resource_type, resource_name=name, resource_pattern_type=pattern,
                         principal=principal, host=host, operation=operation, permission_type=permission)


def create_acls(client: RawClient, creations) -> list[int]:
    cls, _ = schema(30, 3)
    return [int(r.error_code) for r in client.call(cls(creations=tuple(creations))).results]


def delete_acls_request(principal: str, resource_type: int, name: str, pattern: int = LITERAL):
    """DeleteAcls of every ACL of ``principal`` on one resource pattern."""
    cls, m = schema(31, 3)
    return cls(filters=(m.DeleteAclsFilter(resource_type_filter=resource_type, resource_name_filter=name,
                                           pattern_type_filter=pattern, principal_filter=principal, host_filter=None,
                                           operation=1, permission_type=1),))


def acl_principals(client: RawClient, resource_type: int, name: str, pattern: int = LITERAL) -> list[str]:
    """The principals of the ACLs the broker's DescribeAcls shows on one resource pattern, sorted."""
    cls, _ = schema(29, 3)
    response = client.call(cls(resource_type_filter=resource_type, resource_name_filter=name,
                               pattern_type_filter=pattern, principal_filter=None, host_filter=None, operation=1,
                               permission_type=1))
    assert response.error_code == 0, response
    return sorted(acl.principal for r in response.resources for acl in r.acls)


def acl_count(client: RawClient) -> int:
    """How many ACL entries the broker's DescribeAcls shows (every resource, every principal)."""
    cls, _ = schema(29, 3)
    response = client.call(cls(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                               principal_filter=None, host_filter=None, operation=1, permission_type=1))
    assert response.error_code == 0, response
    return sum(len(r.acls) for r in response.resources)


def wait_for_acl_count(client: RawClient, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := acl_count(client)) != count:
        assert time.monotonic() < deadline, f"the broker shows {seen} ACLs, not {count}, after {timeout} s"
        time.sleep(0.1)


def secured_settings(pki, plain_port: int, mtls_port: int, authorizer: str) -> dict:
    """Broker settings (Kafka's names) for ACL tests: PLAINTEXT (User:ANONYMOUS, a super user: the admin) and
    MTLS, an SSL listener requiring a client certificate (its subject is the principal), with ``authorizer``."""
    return {
        "listeners": f"PLAINTEXT://127.0.0.1:{plain_port},MTLS://127.0.0.1:{mtls_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,MTLS:SSL",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": pki.broker_pem_file,
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca_file,
        "listener.name.mtls.ssl.client.auth": "required",
        "authorizer.class.name": authorizer, "super.users": "User:ANONYMOUS",
    }
