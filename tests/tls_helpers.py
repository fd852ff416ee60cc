"""Certificates for TLS tests, made with the cryptography package: a CA (:class:`Pki`) issuing server and
client certificates, PEM and PKCS12 encodings, and :func:`standard_pki` (a CA with a broker certificate for
localhost / 127.0.0.1, a client certificate and an expired one, written as PEM files). Shared by
tests/unit/test_security_tls.py and tests/integration/test_tls_listeners.py."""

from __future__ import annotations

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

PEM = serialization.Encoding.PEM
NOW = datetime.datetime.now(datetime.timezone.utc)
DAY = datetime.timedelta(days=1)


# ---------------------------------------------------------------------------------------------------
# Certificates

class Pki:
    """A CA and certificates it issues; each made once per test module."""

    def __init__(self, tmp, name="Test CA"):
        self.tmp = tmp
        self.ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pykbroker")])
        self.ca = (x509.CertificateBuilder().subject_name(self.ca_name).issuer_name(self.ca_name)
                   .public_key(self.ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(NOW - DAY).not_valid_after(NOW + 30 * DAY)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
                   .sign(self.ca_key, hashes.SHA256()))

    def issue(self, cn, *, sans=("localhost", "127.0.0.1"), key=None, expired=False, ou=None, server=True):
        key = key or rsa.generate_private_key(public_exponent=65537, key_size=2048)
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if ou:
            attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pykbroker"))
        name = x509.Name(attributes)
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(self.ca_name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(NOW - 10 * DAY if expired else NOW - DAY)
                   .not_valid_after(NOW - 2 * DAY if expired else NOW + 30 * DAY))
        alt = []
        for san in sans:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                alt.append(x509.DNSName(san))
        if alt:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        usage = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
                                                              if server else [usage]), critical=False)
        return key, builder.sign(self.ca_key, hashes.SHA256())

    def ca_pem(self):
        return self.ca.public_bytes(PEM).decode()

    def write(self, filename, data):
        path = self.tmp / filename
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(path)


def key_pem(key, password=None):
    encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                  else serialization.NoEncryption())
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, encryption).decode()


def chain_pem(cert, pki):
    return cert.public_bytes(PEM).decode() + pki.ca_pem()


def p12(key, cert, pki, password, name=b"broker"):
    encryption = serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    return pkcs12.serialize_key_and_certificates(name, key, cert, [pki.ca], encryption)


def standard_pki(tmp, name="Test CA"):
    """A Pki in directory ``tmp`` with ``broker`` / ``client`` / ``expired`` certificates and their keys, and
    PEM files: ``broker_pem_file`` and ``client_pem_file`` (key + chain), ``ca_file``."""
    pki = Pki(tmp, name=name)
    pki.broker_key, pki.broker = pki.issue("broker")
    pki.client_key, pki.client = pki.issue("client", sans=(), ou="apps", server=False)
    pki.expired_key, pki.expired = pki.issue("broker", expired=True)
    pki.broker_pem_file = pki.write("broker.pem", key_pem(pki.broker_key) + chain_pem(pki.broker, pki))
    pki.client_pem_file = pki.write("client.pem", key_pem(pki.client_key) + chain_pem(pki.client, pki))
    pki.ca_file = pki.write("ca.pem", pki.ca_pem())
    return pki
