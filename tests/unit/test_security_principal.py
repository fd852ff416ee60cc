"""Principals: KafkaPrincipal parsing, ssl.principal.mapping.rules and the RFC 2253 subject of a client
certificate. Expected values marked "Java" were produced by Kafka 3.7.1's own SslPrincipalMapper and by
Java 17's X500Principal.getName() on the same inputs (certificates built the same way as here)."""

from __future__ import annotations

import datetime
import ssl

import pytest

from pykbroker.security.principal import (
    ANONYMOUS, KafkaPrincipal, NoMatchingRule, SslPrincipalMapper, rfc2253_name, rfc2253_subject, ssl_principal,
)
from pykbroker.security.tls import handshake_check

cryptography = pytest.importorskip("cryptography", reason="certificates for these tests are built with cryptography")
from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.name import _ASN1Type  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

A = x509.NameAttribute


# ---------------------------------------------------------------------------------------------------
# KafkaPrincipal


@pytest.mark.parametrize("text, principal_type, name", [
    ("User:alice", "User", "alice"),
    ("User:CN=x,O=y", "User", "CN=x,O=y"),
    ("User:a:b", "User", "a:b"),      # split at the first colon only
    ("User:", "User", ""),             # Kafka accepts an empty name ...
    (":alice", "", "alice"),           # ... and an empty type
    ("Group:x", "Group", "x"),
    ("User:*", "User", "*"),
])
def test_principal_parse_as_kafka(text, principal_type, name):
    principal = KafkaPrincipal.parse(text)
    assert (principal.principal_type, principal.name) == (principal_type, name)
    assert str(principal) == text


@pytest.mark.parametrize("text", ["alice", "", "*", None, 42])
def test_principal_parse_refuses_with_kafkas_message(text):
    with pytest.raises(ValueError) as info:
        KafkaPrincipal.parse(text)
    assert str(info.value) == f"expected a string in format principalType:principalName but got {text}"


def test_principal_equality_is_type_and_name_and_anonymous():
    assert KafkaPrincipal("User", "alice") == KafkaPrincipal.parse("User:alice")
    assert KafkaPrincipal("User", "alice") != KafkaPrincipal("user", "alice")
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    with pytest.raises(ValueError, match="Principal name cannot be null"):
        KafkaPrincipal("User", None)


# ---------------------------------------------------------------------------------------------------
# ssl.principal.mapping.rules

KAFKA_RULES = ", ".join([
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
    "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
    "DEFAULT",
])


@pytest.mark.parametrize("rules, dn, expected", [
    (KAFKA_RULES, "CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
    (KAFKA_RULES, "CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    (KAFKA_RULES, "cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
    (KAFKA_RULES, "cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
    (KAFKA_RULES, "OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
    ("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT", "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz", "Tkac\\, Adam"),
    # back references to groups the pattern lacks stay literal text (Java)
    ("RULE:^CN=(.*)$/$1@$4/", "CN=a", "a@$4"),
    ("RULE:^CN=(.*)$/$12x/", "CN=a", "a2x"),
    ("RULE:^CN=(.*),O=(.*)$/$12/", "CN=a,O=b", "a2"),
    ("RULE:^CN=(.*)$/$0-$1/", "CN=a", "CN=a-a"),
    ("RULE:.*/X/", "CN=a", "XX"),  # Java's replaceAll also replaces the empty match at the end
    ("RULE:^CN=(?<who>[^,]*).*$/${who}/U", "CN=bob,O=x", "BOB"),
    ("RULE:^CN=(.*)$/\\$1/", "CN=a", "$1"),
    ("RULE:^CN=(.*)$/a\\\\b/", "CN=a", "a\\b"),
    ("RULE:^CN=(a)?(.*)$/[$1][$2]/", "CN=zz", "[][zz]"),
    ("RULE:^CN=([^,]*),.*$/$1/L,\nRULE:^O=(.*)$/org-$1/\n, DEFAULT", "O=Acme", "org-Acme"),
    ("RULE:^CN=(\\w+)\\/x$/$1/", "CN=ab/x", "ab"),
    ("RULE:^CN=(.*)$/\\/$1\\//", "CN=ab", "/ab/"),
    ("RULE:^CN=İ(.*)$/$1/U", "CN=İstanbul", "STANBUL"),
    ("RULE:(.*)/$1/L", "CN=ÀB", "cn=àb"),
    ("RULE:^CN=([a-z]+)$/x$1x/, RULE:^CN=(.*)$/y$1y/", "CN=ABC", "yABCy"),  # first rule that matches
    (None, "CN=a,O=b", "CN=a,O=b"),  # the default rules: DEFAULT
])
def test_mapping_rules_as_java(rules, dn, expected):
    assert SslPrincipalMapper(rules).get_name(dn) == expected


@pytest.mark.parametrize("rules, dn, message", [
    ("RULE:^CN=(.*)$/$4$5/", "CN=a", "No group 5"),
    ("RULE:CN=.*/$1/", "CN=a", "No group 1"),
    ("RULE:^CN=(.*)$/$/", "CN=a", "Illegal group reference: group index is missing"),
    ("RULE:^CN=(.*)$/$x/", "CN=a", "Illegal group reference"),
    ("RULE:^CN=(.*)$/${nope}/", "CN=a", "No group with name {nope}"),
])
def test_replacement_errors_are_javas(rules, dn, message):
    with pytest.raises(ValueError) as info:
        SslPrincipalMapper(rules).get_name(dn)
    assert str(info.value) == message


def test_no_matching_rule_names_dn_and_rules():
    with pytest.raises(NoMatchingRule) as info:
        SslPrincipalMapper("RULE:^O=.*$/x/").get_name("CN=a")
    assert str(info.value) == "No rules apply to CN=a, rules [RULE:^O=.*$/x]"
    with pytest.raises(NoMatchingRule, match=r"rules \[\]"):
        SslPrincipalMapper("").get_name("CN=a")


@pytest.mark.parametrize("rules, shown", [
    ("", "[]"), ("DEFAULT", "[DEFAULT]"), ("RULE://", "[RULE:/]"), ("RULE:/.*/", "[RULE:/.*]"),
    ("RULE:/.*/L", "[RULE:/.*/L]"), ("RULE://,DEFAULT", "[RULE:/, DEFAULT]"),
    ("  RULE:// ,  DEFAULT  ", "[RULE:/, DEFAULT]"), ("  RULE:   /     / ,  DEFAULT  ", "[RULE:   /     , DEFAULT]"),
    ("  RULE:  /     /U   ,DEFAULT  ", "[RULE:  /     /U, DEFAULT]"),
    ("  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ", "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]"),
    (",   , , ,      , , ,   ", "[]"), (",,RULE://,,,DEFAULT,,", "[RULE:/, DEFAULT]"),
    ("RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//", "[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]"),
    ("RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/", "[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]"),
    ("RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT",
     "[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]"),
    ("RULE:a/b/U,\n\n DEFAULT\n", "[RULE:a/b/U, DEFAULT]"),  # one rule a line, commas between
    # Without commas Kafka keeps only what its splitter finds: here only DEFAULT (Java shows the same).
    ("RULE:a/b/\nRULE:c/d/U\nDEFAULT", "[DEFAULT]"),
])
def test_rules_splitting_as_kafka(rules, shown):
    assert str(SslPrincipalMapper(rules)) == f"SslPrincipalMapper(rules = {shown})"


@pytest.mark.parametrize("rules, message", [
    ("default", "Invalid rule: `default`, unmatched substring: `default`"),
    ("DEFAUL", "Invalid rule: `DEFAUL`, unmatched substring: `DEFAUL`"),
    ("DEFAULT/L", "Invalid rule: `DEFAULT/L`, unmatched substring: `/L`"),
    ("DEFAULT/U", "Invalid rule: `DEFAULT/U`, unmatched substring: `/U`"),
    ("RULE:CN=(.*?),OU=ServiceUsers.*/$1", "Invalid rule: `RULE:CN=(.*?)`, unmatched substring: `RULE:CN=(.*?)`"),
    ("rule:^CN=(.*?),OU=ServiceUsers.*$/$1/", "Invalid rule: `rule:^CN=(.*?)`, unmatched substring: `rule:^CN=(.*?)`"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
     "Invalid rule: `RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U`, unmatched substring: `/U`"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/L", "Invalid rule: `RULE:^CN=(.*?)`, unmatched substring: `RULE:^CN=(.*?)`"),
    ("RULE:^CN=(.*?),OU=ServiceUsers.*$/LU", "Invalid rule: `RULE:^CN=(.*?)`, unmatched substring: `RULE:^CN=(.*?)`"),
    ("RULE:x/y/Lgarbage", "Invalid rule: `RULE:x/y/Lgarbage`, unmatched substring: `garbage`"),
    ("DEFAULT DEFAULT", "Invalid rule: `DEFAULT DEFAULT`, unmatched substring: ` DEFAULT`"),
    ("RULE:^CN=([^,]*),.*$/$1/L\nDEFAULT", "Invalid rule: `RULE:^CN=([^`, unmatched substring: `RULE:^CN=([^`"),
])
def test_invalid_rules_get_kafkas_message(rules, message):
    with pytest.raises(ValueError) as info:
        SslPrincipalMapper(rules)
    assert str(info.value) == message


def test_bad_pattern_and_bad_input_are_clear_errors():
    with pytest.raises(ValueError, match=r"Invalid rule: `RULE:bad\(/x/`: bad pattern"):
        SslPrincipalMapper("RULE:^CN=(.*)$/$1/L, RULE:bad(/x/")
    with pytest.raises(ValueError, match="more than"):
        SslPrincipalMapper("DEFAULT," * 20_000)
    with pytest.raises(ValueError, match="must be a string"):
        SslPrincipalMapper(["DEFAULT"])


# ---------------------------------------------------------------------------------------------------
# RFC 2253 subjects

_KEY = ec.generate_private_key(ec.SECP256R1())


def make_certificate(rdns, *, issuer_key=_KEY, issuer_name=None, key=None, ca=False):
    subject = x509.Name([x509.RelativeDistinguishedName(rdn) for rdn in rdns])
    issuer = issuer_name if issuer_name is not None else x509.Name(
        [x509.RelativeDistinguishedName([A(NameOID.COMMON_NAME, "issuer")])])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key((key or _KEY).public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1)))
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return builder.sign(issuer_key, hashes.SHA256())


# What Java 17's X500Principal.getName() printed for certificates with these subjects.
JAVA_SUBJECTS = {
    "basic": ([[A(NameOID.COUNTRY_NAME, "US")], [A(NameOID.ORGANIZATION_NAME, "Org")],
               [A(NameOID.ORGANIZATIONAL_UNIT_NAME, "ServiceUsers")], [A(NameOID.COMMON_NAME, "Duke")]],
              "CN=Duke,OU=ServiceUsers,O=Org,C=US"),
    "email": ([[A(NameOID.COMMON_NAME, "alice")], [A(NameOID.EMAIL_ADDRESS, "alice@example.com")]],
              "1.2.840.113549.1.9.1=#1611616c696365406578616d706c652e636f6d,CN=alice"),
    "special": ([[A(NameOID.ORGANIZATION_NAME, 'a,b+c"d\\e<f>g;h=i#j')], [A(NameOID.COMMON_NAME, "x")]],
                'CN=x,O=a\\,b\\+c\\"d\\\\e\\<f\\>g\\;h\\=i\\#j'),
    "spaces": ([[A(NameOID.COMMON_NAME, "  lead and trail  ")]], "CN=\\ \\ lead and trail\\ \\ "),
    "hash_lead": ([[A(NameOID.COMMON_NAME, "#hash")]], "CN=\\#hash"),
    "utf8": ([[A(NameOID.COMMON_NAME, "Jürgen Ø 東京")]], "CN=Jürgen Ø 東京"),
    # Java decodes a BMPString's bytes as UTF-8: the NULs of UTF-16 become "\00"
    "bmp": ([[A(NameOID.COMMON_NAME, "bmpé", _type=_ASN1Type.BMPString)]], "CN=\\00b\\00m\\00p\\00\ufffd"),
    "universal": ([[A(NameOID.COMMON_NAME, "uni", _type=_ASN1Type.UniversalString)]],
                  "CN=#1c0c000000750000006e00000069"),
    "ia5_dc": ([[A(NameOID.DOMAIN_COMPONENT, "com", _type=_ASN1Type.IA5String)],
                [A(NameOID.DOMAIN_COMPONENT, "example", _type=_ASN1Type.IA5String)], [A(NameOID.USER_ID, "u1")]],
               "UID=u1,DC=example,DC=com"),
    "multi": ([[A(NameOID.COMMON_NAME, "bob"), A(NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"),
                A(NameOID.EMAIL_ADDRESS, "b@x")], [A(NameOID.ORGANIZATION_NAME, "O1")]],
              "O=O1,CN=bob+OU=eng+1.2.840.113549.1.9.1=#1603624078"),
    "misc": ([[A(NameOID.SERIAL_NUMBER, "1234")], [A(NameOID.STATE_OR_PROVINCE_NAME, "CA")],
              [A(NameOID.LOCALITY_NAME, "SF")], [A(NameOID.STREET_ADDRESS, "1 Main St")], [A(NameOID.TITLE, "boss")],
              [A(NameOID.GIVEN_NAME, "G")], [A(NameOID.SURNAME, "S")], [A(NameOID.DN_QUALIFIER, "q")]],
             "2.5.4.46=#130171,2.5.4.4=#0c0153,2.5.4.42=#0c0147,2.5.4.12=#0c04626f7373,STREET=1 Main St,L=SF,ST=CA,"
             "2.5.4.5=#130431323334"),
    "nul": ([[A(NameOID.COMMON_NAME, "a\x00b")]], "CN=a\\00b"),
    "cr": ([[A(NameOID.COMMON_NAME, "\ra b\r")]], "CN=\\\ra b\\\r"),
    "printable": ([[A(NameOID.COMMON_NAME, "Print Able", _type=_ASN1Type.PrintableString)]], "CN=Print Able"),
    "t61": ([[A(NameOID.COMMON_NAME, "teletex", _type=_ASN1Type.T61String)]], "CN=teletex"),
    "empty_subject": ([], ""),
    "other_chars": ([[A(NameOID.COMMON_NAME, "a@b_c*d&e!f%g~h`i|j{k}l[m]n^o$p'q(r)s:t?u/v")]],
                    "CN=a@b_c*d&e!f%g~h`i|j{k}l[m]n^o$p'q(r)s:t?u/v"),
    "space_only": ([[A(NameOID.COMMON_NAME, " ")]], "CN=\\ "),
    "backslash_end": ([[A(NameOID.COMMON_NAME, "ab\\")]], "CN=ab\\\\"),
    "unknown_oid": ([[A(x509.ObjectIdentifier("1.3.6.1.4.1.99999.1"), "custom")], [A(NameOID.COMMON_NAME, "c")]],
                    "CN=c,1.3.6.1.4.1.99999.1=#0c06637573746f6d"),
}


@pytest.mark.parametrize("case", sorted(JAVA_SUBJECTS))
def test_subject_rendered_as_java(case):
    rdns, expected = JAVA_SUBJECTS[case]
    certificate = make_certificate(rdns)
    assert rfc2253_subject(certificate.public_bytes(serialization.Encoding.DER)) == expected
    assert rfc2253_name(certificate.subject.public_bytes()) == expected


@pytest.mark.parametrize("data", [
    b"", b"\x30", b"\x30\x84\xff\xff\xff\xff", b"\x30\x80\x00\x00", b"not a certificate at all",
    b"\x30\x03\x02\x01\x01", b"\x30\x05\x30\x03\x02\x01\x01", b"\x31" + b"\x00" * 10,
])
def test_malformed_certificates_are_clear_errors(data):
    with pytest.raises(ValueError, match="certificate"):
        rfc2253_subject(data)


def test_truncations_of_a_real_certificate_never_crash():
    der = make_certificate(JAVA_SUBJECTS["multi"][0]).public_bytes(serialization.Encoding.DER)
    for cut in range(0, len(der), 7):
        try:
            rfc2253_subject(der[:cut])
        except ValueError as exc:
            assert "certificate" in str(exc)
    with pytest.raises(ValueError, match="DER bytes"):
        rfc2253_subject("CN=x")


def test_principal_of_a_real_tls_client(tmp_path):
    """A client certificate seen by Python's ssl module (getpeercert(binary_form=True)) maps as Kafka maps it."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.RelativeDistinguishedName([A(NameOID.COMMON_NAME, "test-ca")])])
    ca = make_certificate([[A(NameOID.COMMON_NAME, "test-ca")]], issuer_key=ca_key, issuer_name=ca_name,
                          key=ca_key, ca=True)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server_cert = make_certificate([[A(NameOID.COMMON_NAME, "localhost")]], issuer_key=ca_key, issuer_name=ca_name,
                                   key=server_key)
    client_cert = make_certificate([[A(NameOID.COUNTRY_NAME, "US")], [A(NameOID.ORGANIZATION_NAME, "Org")],
                                    [A(NameOID.ORGANIZATIONAL_UNIT_NAME, "ServiceUsers")],
                                    [A(NameOID.COMMON_NAME, "Duke")]],
                                   issuer_key=ca_key, issuer_name=ca_name, key=client_key)

    def write(name, cert, key):
        path = tmp_path / name
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return str(path)

    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(write("server.pem", server_cert, server_key))
    server_context.load_verify_locations(str(tmp_path / "ca.pem"))
    server_context.verify_mode = ssl.CERT_REQUIRED
    client_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_context.load_verify_locations(str(tmp_path / "ca.pem"))
    client_context.load_cert_chain(write("client.pem", client_cert, client_key))
    client_context.check_hostname = False  # handshake_check's client names no server

    server = handshake_check(server_context, client_context)
    der = server.getpeercert(binary_form=True)
    assert rfc2253_subject(der) == "CN=Duke,OU=ServiceUsers,O=Org,C=US"
    mapper = SslPrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT")
    assert ssl_principal(der, mapper) == KafkaPrincipal("User", "duke")
    assert ssl_principal(None, mapper) == ANONYMOUS
    with pytest.raises(NoMatchingRule):
        ssl_principal(der, SslPrincipalMapper("RULE:^O=x$/y/"))


# ---------------------------------------------------------------------------------------------------
# Any bytes, any rules: a result or ValueError, nothing else

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_render_or_are_refused(data):
    try:
        rfc2253_subject(data)
    except ValueError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="RULE:DEFAULT/\\,$(){}[].*?^LU01 \n", max_size=40), st.text(max_size=20))
def test_any_rules_parse_and_apply_or_are_refused(rules, dn):
    try:
        mapper = SslPrincipalMapper(rules)
    except ValueError:
        return
    try:
        mapper.get_name(dn)
    except ValueError:  # NoMatchingRule and Java's replacement errors
        pass


_REAL_DER = make_certificate(JAVA_SUBJECTS["multi"][0] + JAVA_SUBJECTS["misc"][0]).public_bytes(
    serialization.Encoding.DER)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_REAL_DER) - 1), st.integers(0, 255)), min_size=1, max_size=4))
def test_corrupted_certificates_render_or_are_refused(changes):
    data = bytearray(_REAL_DER)
    for position, value in changes:
        data[position] = value
    try:
        assert isinstance(rfc2253_subject(bytes(data)), str)
    except ValueError:
        pass
