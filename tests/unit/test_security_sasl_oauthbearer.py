"""SASL/OAUTHBEARER as Kafka 3.7's OAuthBearerSaslServer serves it: the client initial response, Kafka's
unsecured JWS validator and options, the KIP-768 signed-JWT validator against a JWKS file (keys generated and
tokens signed here with the cryptography package), the {"status":"invalid_token"}-then-failure exchange,
kafka-python's OAUTHBEARER client, and bad input ending in SaslAuthenticationFailed."""

from __future__ import annotations

import base64
import json
import logging
import random

import pytest

from pykbroker.security.jaas import OAUTHBEARER_LOGIN_MODULE, parse_jaas_config
from pykbroker.security.sasl import IllegalSaslState, SaslAuthenticationFailed, SaslConfigError
from pykbroker.security.sasl import oauthbearer as ob
from pykbroker.security.sasl.oauthbearer import (
    ClientInitialResponse,
    InvalidClientResponse,
    InvalidToken,
    JwksFileKeyResolver,
    OAuthBearerServerFactory,
    SignedJwtValidator,
    UnsecuredJwsValidator,
    parse_client_initial_response,
)

NOW = 1_800_000_000.0  # the tests' clock, seconds
GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism OAUTHBEARER"
INVALID_TOKEN = '{"status":"invalid_token"}'
NAN_JSON = b'{"exp": NaN}'
NONE_HEADER = b'{"alg":"none"}'
HS256_HEADER = b'{"alg":"HS256","kid":"sym"}'


def clock() -> float:
    return NOW


def std_b64(doc) -> str:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return base64.b64encode(raw).decode().rstrip("=")


def unsecured(claims: dict, header: dict | None = None, signature: str = "") -> str:
    return f"{std_b64(header or {'alg': 'none'})}.{std_b64(claims)}.{signature}"


def claims(**kw):
    base = {"sub": "alice", "iat": NOW - 10, "exp": NOW + 3600}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


def initial(token: str, authzid: str = "", **extensions) -> bytes:
    return ClientInitialResponse(token, authzid, extensions).to_bytes()


def unsecured_factory(**options) -> OAuthBearerServerFactory:
    return OAuthBearerServerFactory(UnsecuredJwsValidator(options, clock=clock))


def refused(server, data: bytes) -> str:
    """The JSON error answer, then the failure after the client's 0x01, as Kafka's exchange goes."""
    answer = server.evaluate(data)
    assert answer.startswith(b'{"status":"') and not server.complete
    with pytest.raises(SaslAuthenticationFailed) as e:
        server.evaluate(b"\x01")
    assert e.value.client_message() == answer.decode() and e.value.error_code == 58
    return answer.decode()


# --- the client initial response -----------------------------------------------------------------------------

def test_parse_initial_response_with_authzid_and_extensions():
    r = parse_client_initial_response(b"n,a=alice,\x01auth=Bearer abc.def.\x01traceId=123 4\x01x=y\x01\x01")
    assert (r.token, r.authorization_id, dict(r.extensions)) == ("abc.def.", "alice", {"traceId": "123 4", "x": "y"})
    assert "abc.def." not in repr(r)
    assert parse_client_initial_response(b"n,,\x01auth=bEaReR  t0k-_.\x01\x01").token == "t0k-_."


@pytest.mark.parametrize("data, message", [
    (b"", "Invalid OAUTHBEARER client first message"),
    (b"\x01", "Invalid OAUTHBEARER client first message"),
    (b"n,,\x01auth=Bearer t\x01", "Invalid OAUTHBEARER client first message"),
    (b"y,,\x01auth=Bearer t\x01\x01", "Invalid OAUTHBEARER client first message"),
    (b"n,,\x01x1=y\x01auth=Bearer t\x01\x01", "Invalid OAUTHBEARER client first message"),
    (b"n,,\x01auth=Bearer t\xff\x01\x01", "Invalid OAUTHBEARER client first message"),
    (b"n,,\x01x=y\x01\x01", "Invalid OAUTHBEARER client first message: 'auth' not specified"),
    (b"n,,\x01auth=Bearer\x01\x01", "Invalid OAUTHBEARER client first message: invalid 'auth' format"),
    (b"n,,\x01auth=Bearer a b\x01\x01", "Invalid OAUTHBEARER client first message: invalid 'auth' format"),
    (b"n,,\x01auth=Bearer a+b\x01\x01", "Invalid OAUTHBEARER client first message: invalid 'auth' format"),
    (b"n,,\x01auth=Basic dXNlcjpwdw\x01\x01", "Invalid scheme in OAUTHBEARER client first message: Basic"),
])
def test_malformed_initial_responses(data, message):
    with pytest.raises(InvalidClientResponse) as e:
        parse_client_initial_response(data)
    assert str(e.value) == message
    server = unsecured_factory().new_server()
    with pytest.raises(SaslAuthenticationFailed) as f:
        server.evaluate(data)
    assert f.value.client_message() == GENERIC  # a SaslException in Kafka: the generic text


# --- the unsecured validator ---------------------------------------------------------------------------------

def test_unsecured_token_authenticates_with_lifetime_and_extensions():
    server = unsecured_factory().new_server()
    assert server.evaluate(initial(unsecured(claims(scope="a b")), traceId="t1")) == b""
    assert server.complete and server.authorized_id == "alice"
    assert server.credential_expiry_ms == int((NOW + 3600) * 1000)
    assert server.extensions == {"traceId": "t1"}
    assert server.token.scope == frozenset({"a b"})  # a string scope is one item, as in Kafka
    assert server.token.start_time_ms == int((NOW - 10) * 1000)
    with pytest.raises(IllegalSaslState):
        server.evaluate(b"\x01")


def test_kafka_python_oauth_client_against_the_unsecured_validator():
    from kafka.net.sasl.oauth import AbstractTokenProvider, SaslMechanismOAuth

    class Provider(AbstractTokenProvider):
        def __init__(self, token):
            self._token = token

        def token(self):
            return self._token

        def extensions(self):
            return {"logicalCluster": "lkc-1"}

    client = SaslMechanismOAuth(sasl_oauth_token_provider=Provider(unsecured(claims())))
    server = unsecured_factory().new_server()
    client.receive(server.evaluate(client.auth_bytes()))
    assert client.is_authenticated() and server.authorized_id == "alice"
    assert server.extensions == {"logicalCluster": "lkc-1"}

    expired = SaslMechanismOAuth(sasl_oauth_token_provider=Provider(unsecured(claims(exp=NOW - 1))))
    server = unsecured_factory().new_server()
    expired.receive(server.evaluate(expired.auth_bytes()))  # the JSON error
    assert expired.auth_bytes() == b"\x01"
    with pytest.raises(SaslAuthenticationFailed) as e:
        server.evaluate(expired.auth_bytes())
    assert e.value.client_message() == INVALID_TOKEN


@pytest.mark.parametrize("token, reason", [
    (unsecured(claims(), {"alg": "RS256"}), "Unsecured JWS must have 'none' for an algorithm"),
    (unsecured(claims(), {"typ": "JWT"}), "JWS header must have an Algorithm value"),
    (unsecured(claims(), signature="c2ln"), "Unsecured JWS must not contain a digital signature"),
    (unsecured(claims(exp=None)), "No expiration time in JWT"),
    (unsecured(claims(exp="soon")), "The 'exp' claim was not of type Number: String"),
    (unsecured(claims(sub=None)), "No principal name in JWT claim: sub"),
    (unsecured(claims(sub="  ")), "No principal name in JWT claim: sub"),
    (unsecured(claims(sub=42)), "The 'sub' claim was not of type String: Integer"),
    (unsecured(claims(scope=5)), "The 'scope' claim was not of type List: Integer"),
    (unsecured(claims(exp=NOW)), "was on or after the Expiration Time value"),
    (unsecured(claims(iat=NOW + 60)), "was after the indicated time"),
    (unsecured(claims(iat=NOW - 10, exp=NOW - 15)), "was on or after the Expiration Time"),
    ("a..b", "Malformed compact serialization contains '..'"),
    ("a.b", "Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded values"),
    ("a.b.c.d", "Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded values"),
    (f"{std_b64({'alg': 'none'})}.{std_b64(b'not json')}.", "malformed JSON"),
    (f"{std_b64({'alg': 'none'})}.{std_b64(b'[1,2]')}.", "JSON is not an object"),
    (f"{std_b64({'alg': 'none'})}.{std_b64(NAN_JSON)}.", "malformed JSON"),
    (f"{std_b64({'alg': 'none'})}.-_-_.", "malformed Base64 URL encoded value"),
    (f"{std_b64({'alg': 'none'})}.{std_b64(b'[' * 5000)}.", "malformed JSON"),
])
def test_unsecured_validator_refusals(token, reason):
    with pytest.raises(InvalidToken) as e:
        UnsecuredJwsValidator({}, clock=clock).validate(token)
    assert reason in e.value.reason
    assert refused(unsecured_factory().new_server(), initial(token)) == INVALID_TOKEN


def test_exp_not_after_iat_is_refused():
    with pytest.raises(InvalidToken, match="was not after the Issued At time"):
        UnsecuredJwsValidator({"unsecuredValidatorAllowableClockSkewMs": "10000"}, clock=clock).validate(
            unsecured(claims(iat=NOW + 5, exp=NOW + 5)))


def test_allowable_clock_skew_option():
    token = unsecured(claims(exp=NOW - 1))
    with pytest.raises(InvalidToken):
        UnsecuredJwsValidator({}, clock=clock).validate(token)
    v = UnsecuredJwsValidator({"unsecuredValidatorAllowableClockSkewMs": " 2000 "}, clock=clock)
    assert v.validate(token).principal_name == "alice"
    assert v.validate(unsecured(claims(iat=NOW + 1))).principal_name == "alice"


def test_principal_and_scope_claim_name_options_and_required_scope():
    options = {"unsecuredValidatorPrincipalClaimName": "client_id", "unsecuredValidatorScopeClaimName": "scp",
               "unsecuredValidatorRequiredScope": "kafka  write"}
    v = UnsecuredJwsValidator(options, clock=clock)
    token = v.validate(unsecured(claims(sub=None, client_id="svc-1", scp=["kafka", " write ", "", "x"])))
    assert token.principal_name == "svc-1" and token.scope == frozenset({"kafka", "write", "x"})
    server = OAuthBearerServerFactory(v).new_server()
    answer = refused(server, initial(unsecured(claims(sub=None, client_id="svc-1", scp="kafka"))))
    assert answer == '{"status":"insufficient_scope", "scope":"[kafka, write]"}'


@pytest.mark.parametrize("options, message", [
    ({"unsecuredValidatorAllowableClockSkewMs": "-1"}, "Allowable clock skew millis must not be negative: -1"),
    ({"unsecuredValidatorAllowableClockSkewMs": "soon"}, 'For input string: "soon"'),
    ({"unsecuredValidatorRequiredScope": "a\"b"}, 'Invalid scope value: a"b'),
])
def test_bad_unsecured_options_are_startup_errors(options, message):
    with pytest.raises(SaslConfigError) as e:
        UnsecuredJwsValidator(options)
    assert message in str(e.value)


def test_options_come_from_the_jaas_entry_through_the_factory():
    entry = parse_jaas_config(f'{OAUTHBEARER_LOGIN_MODULE} required unsecuredValidatorRequiredScope="s1";')[0]
    factory = ob.server_factory("SASL_PLAINTEXT", entry, {}, None, clock=clock)
    assert factory.validator.required_scope == ["s1"]
    with pytest.raises(SaslConfigError, match="cannot load Java callback handlers"):
        ob.server_factory("SASL_PLAINTEXT", entry, {}, "com.example.Handler")


def test_retry_after_an_error_and_authzid_rules():
    server = unsecured_factory().new_server()
    assert server.evaluate(initial(unsecured(claims(exp=NOW - 100)))) == INVALID_TOKEN.encode()
    assert server.evaluate(initial(unsecured(claims()))) == b""  # Kafka processes a new token after an error
    assert server.authorized_id == "alice"
    assert unsecured_factory().new_server().evaluate(initial(unsecured(claims()), authzid="alice")) == b""
    with pytest.raises(SaslAuthenticationFailed) as e:
        unsecured_factory().new_server().evaluate(initial(unsecured(claims()), authzid="admin"))
    assert e.value.client_message() == ("Authentication failed: Client requested an authorization id (admin) that "
                                        "is different from the token's principal name (alice)")


def test_control_a_without_a_pending_error_is_a_malformed_message():
    with pytest.raises(SaslAuthenticationFailed) as e:
        unsecured_factory().new_server().evaluate(b"\x01")
    assert e.value.client_message() == GENERIC


def test_tokens_never_reach_the_log(caplog):
    caplog.set_level(logging.DEBUG, logger="pykbroker")
    bad = unsecured(claims(exp=NOW - 100))
    good = unsecured(claims())
    refused(unsecured_factory().new_server(), initial(bad))
    unsecured_factory().new_server().evaluate(initial(good))
    assert bad not in caplog.text and good not in caplog.text
    assert bad.split(".")[1] not in caplog.text


def test_random_bytes_never_escape_as_another_exception():
    rng = random.Random(19)
    prefix = [b"", b"n,,\x01auth=Bearer ", b"n,,\x01auth=Bearer " + unsecured(claims()).encode()[:40]]
    for i in range(500):
        data = rng.choice(prefix) + bytes(rng.randrange(256) for _ in range(rng.randint(0, 80)))
        if i % 3 == 0:
            data += b"\x01\x01"
        server = unsecured_factory().new_server()
        try:
            answer = server.evaluate(data)
        except SaslAuthenticationFailed:
            continue
        assert answer == b"" or answer.startswith(b'{"status":"')


def test_oversized_token_is_refused_before_parsing():
    server = OAuthBearerServerFactory(UnsecuredJwsValidator({}, clock=clock), max_receive_size=1000).new_server()
    with pytest.raises(SaslAuthenticationFailed) as e:
        server.evaluate(initial("a" * 2000 + ".b."))
    assert e.value.client_message() == "Failing SASL authentication due to invalid receive size"


# --- KIP-768: signed JWTs against a JWKS file -----------------------------------------------------------------

def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def b64url_int(n: int) -> str:
    return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))


@pytest.fixture(scope="module")
def keys():
    pytest.importorskip("cryptography", reason="the signed-JWT validator needs the cryptography package")
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    return {"rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "rsa-other": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "rsa-small": rsa.generate_private_key(public_exponent=65537, key_size=1024),
            "ec": ec.generate_private_key(ec.SECP256R1()),
            "ec384": ec.generate_private_key(ec.SECP384R1())}


def jwk(private, kid: str, **extra) -> dict:
    from cryptography.hazmat.primitives.asymmetric import rsa

    pub = private.public_key().public_numbers()
    if isinstance(private, rsa.RSAPrivateKey):
        out = {"kty": "RSA", "kid": kid, "n": b64url_int(pub.n), "e": b64url_int(pub.e)}
    else:
        crv = {256: "P-256", 384: "P-384"}[private.curve.key_size]
        size = (private.curve.key_size + 7) // 8
        out = {"kty": "EC", "kid": kid, "crv": crv, "x": b64url(pub.x.to_bytes(size, "big")),
               "y": b64url(pub.y.to_bytes(size, "big"))}
    out.update(extra)
    return out


@pytest.fixture
def jwks_file(tmp_path, keys):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [
        {"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},  # not a public key: skipped
        jwk(keys["rsa"], "rsa-1", use="sig"), jwk(keys["ec"], "ec-1"), jwk(keys["ec384"], "ec-384"),
        jwk(keys["rsa-small"], "small"), jwk(keys["rsa-other"], "enc-only", use="enc"),
    ]}))
    return path


def sign(private, header: dict, payload: dict | bytes) -> str:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, padding
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(body)}".encode()
    alg = header["alg"]
    digest = {"256": hashes.SHA256(), "384": hashes.SHA384(), "512": hashes.SHA512()}[alg[2:]]
    if alg.startswith("RS"):
        sig = private.sign(signing_input, padding.PKCS1v15(), digest)
    elif alg.startswith("PS"):
        sig = private.sign(signing_input, padding.PSS(mgf=padding.MGF1(digest), salt_length=digest.digest_size), digest)
    else:
        r, s = decode_dss_signature(private.sign(signing_input, ec.ECDSA(digest)))
        size = (private.curve.key_size + 7) // 8
        sig = r.to_bytes(size, "big") + s.to_bytes(size, "big")
    return f"{signing_input.decode()}.{b64url(sig)}"


def signed_validator(jwks_file, **configs) -> SignedJwtValidator:
    base = {"sasl.oauthbearer.jwks.endpoint.url": jwks_file.as_uri()}
    base.update(configs)
    return SignedJwtValidator.from_configs("SASL_SSL", base, clock=clock)


def jwt_claims(**kw):
    base = {"sub": "svc-orders", "iat": int(NOW) - 10, "exp": int(NOW) + 600, "scope": "kafka"}
    base.update(kw)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize("alg, key, kid", [
    ("RS256", "rsa", "rsa-1"), ("RS512", "rsa", "rsa-1"), ("PS256", "rsa", "rsa-1"), ("ES256", "ec", "ec-1"),
    ("ES384", "ec384", "ec-384"), ("RS256", "rsa", None),
])
def test_signed_tokens_authenticate(jwks_file, keys, alg, key, kid):
    header = {"alg": alg, "typ": "JWT"} | ({"kid": kid} if kid else {})
    token = sign(keys[key], header, jwt_claims())
    server = OAuthBearerServerFactory(signed_validator(jwks_file)).new_server()
    assert server.evaluate(initial(token)) == b""
    assert server.authorized_id == "svc-orders"
    assert server.credential_expiry_ms == (int(NOW) + 600) * 1000
    assert server.token.scope == frozenset({"kafka"}) and server.token.start_time_ms == (int(NOW) - 10) * 1000


def refused_signed(validator, token) -> str:
    with pytest.raises(InvalidToken) as e:
        validator.validate(token)
    assert refused(OAuthBearerServerFactory(validator).new_server(), initial(token)) == INVALID_TOKEN
    return e.value.reason


def test_signature_checks(jwks_file, keys):
    v = signed_validator(jwks_file)
    good = sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"}, jwt_claims())
    assert "invalid signature" in refused_signed(v, sign(keys["rsa-other"], {"alg": "RS256", "kid": "rsa-1"}, jwt_claims()))
    h, p, s = good.split(".")
    tampered = f"{h}.{b64url(json.dumps(jwt_claims(sub='admin')).encode())}.{s}"
    assert "invalid signature" in refused_signed(v, tampered)
    assert "not a permitted algorithm" in refused_signed(v, f"{b64url(NONE_HEADER)}.{p}.{s}")
    assert "suitable verification key" in refused_signed(v, sign(keys["rsa"], {"alg": "RS256", "kid": "nope"}, jwt_claims()))
    assert "suitable verification key" in refused_signed(v, sign(keys["rsa-other"], {"alg": "RS256", "kid": "enc-only"}, jwt_claims()))
    assert "suitable verification key" in refused_signed(v, sign(keys["ec"], {"alg": "ES384", "kid": "ec-1"}, jwt_claims()))
    assert "2048 bits" in refused_signed(v, sign(keys["rsa-small"], {"alg": "RS256", "kid": "small"}, jwt_claims()))
    hs = f"{b64url(HS256_HEADER)}.{p}.{s}"
    assert "not served" in refused_signed(v, hs)
    crit = sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1", "crit": ["exp"]}, jwt_claims())
    assert "crit" in refused_signed(v, crit)
    es_bad_len = sign(keys["ec"], {"alg": "ES256", "kid": "ec-1"}, jwt_claims())[:-4]
    assert refused_signed(v, es_bad_len)


@pytest.mark.parametrize("token_claims, reason", [
    (jwt_claims(exp=int(NOW) - 30), "no longer valid"),
    (jwt_claims(exp=None), "No Expiration Time (exp) claim present."),
    (jwt_claims(iat=None), "No Issued At (iat) claim present."),
    (jwt_claims(nbf=int(NOW) + 31), "not yet valid"),
    (jwt_claims(exp="later"), "The value of the 'exp' claim is not the expected type"),
    (jwt_claims(aud="some-api"), "no expected audience value(s) were provided"),
    (jwt_claims(sub=None), "sub value must be non-null"),
    (jwt_claims(sub="   "), "sub value must not contain only whitespace"),
    (jwt_claims(sub=7), "The value of the 'sub' claim is not the expected type"),
    (jwt_claims(scope=["a", "a "]), "scope value must not contain duplicates - a already present"),
    (jwt_claims(scope=["a", 3]), "Could not extract the 'scope' claim"),
    (jwt_claims(scope=[""]), "scope value must be non-empty"),
])
def test_claim_checks(jwks_file, keys, token_claims, reason):
    token = sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"}, token_claims)
    assert reason in refused_signed(signed_validator(jwks_file), token)


def test_clock_skew_default_30_seconds_and_configurable(jwks_file, keys):
    token = sign(keys["ec"], {"alg": "ES256", "kid": "ec-1"}, jwt_claims(exp=int(NOW) - 29, nbf=int(NOW) + 29))
    assert signed_validator(jwks_file).validate(token).principal_name == "svc-orders"
    v = signed_validator(jwks_file, **{"sasl.oauthbearer.clock.skew.seconds": "0"})
    assert "no longer valid" in refused_signed(v, token)


def test_issuer_and_audience(jwks_file, keys):
    v = signed_validator(jwks_file, **{"sasl.oauthbearer.expected.issuer": "https://idp",
                                       "sasl.oauthbearer.expected.audience": "kafka, other"})
    ok = sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"}, jwt_claims(iss="https://idp", aud=["x", "kafka"]))
    assert v.validate(ok).principal_name == "svc-orders"
    for c, reason in [(jwt_claims(aud="kafka"), "No Issuer (iss) claim present but was expecting https://idp"),
                      (jwt_claims(iss="https://evil", aud="kafka"), "doesn't match expected value of https://idp"),
                      (jwt_claims(iss="https://idp"), "No Audience (aud) claim present."),
                      (jwt_claims(iss="https://idp", aud=["x"]), "doesn't contain an acceptable identifier")]:
        assert reason in refused_signed(v, sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"}, c))


def test_listener_and_mechanism_prefixed_claim_names(jwks_file, keys):
    v = SignedJwtValidator.from_configs("SASL_SSL", {
        "listener.name.sasl_ssl.oauthbearer.sasl.oauthbearer.jwks.endpoint.url": jwks_file.as_uri(),
        "listener.name.sasl_ssl.oauthbearer.sasl.oauthbearer.sub.claim.name": "client_id",
        "sasl.oauthbearer.scope.claim.name": "scp"}, clock=clock)
    token = v.validate(sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"},
                            jwt_claims(sub=None, client_id="svc-2", scp=["r", "w"], scope=None)))
    assert token.principal_name == "svc-2" and token.scope == frozenset({"r", "w"})


@pytest.mark.parametrize("token", ["", "   ", "a.b", "a.b.", "a..c", ".b.c", "a.b.c.d", "!!.b.c", "e30.e30.e30",
                                   "x" * 3000])
def test_malformed_jwts(jwks_file, token):
    with pytest.raises(InvalidToken):
        signed_validator(jwks_file).validate(token)


def test_factory_selects_the_validator_by_callback_handler_class(jwks_file):
    entry = parse_jaas_config(f"{OAUTHBEARER_LOGIN_MODULE} required;")[0]
    configs = {"sasl.oauthbearer.jwks.endpoint.url": jwks_file.as_uri()}
    for name in ("org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
                 "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerValidatorCallbackHandler"):
        assert isinstance(ob.server_factory("L", entry, configs, name).validator, SignedJwtValidator)
    assert isinstance(ob.server_factory("L", entry, configs, ob.UNSECURED_CALLBACK_HANDLER).validator,
                      UnsecuredJwsValidator)


def test_jwks_configuration_errors(tmp_path, jwks_file):
    def err(**configs) -> str:
        with pytest.raises(SaslConfigError) as e:
            SignedJwtValidator.from_configs("L", configs)
        return str(e.value)

    url = "sasl.oauthbearer.jwks.endpoint.url"
    assert "must be non-null" in err()
    # an http(s) JWKS that cannot be fetched at start stops the start (Kafka's RefreshingHttpsJwks.init)
    assert "Could not refresh JWKS from http://127.0.0.1:9/keys" in err(**{url: "http://127.0.0.1:9/keys"})
    assert "Not a number of type LONG" in err(**{url: "http://127.0.0.1:9/keys",
                                                 "sasl.oauthbearer.jwks.endpoint.refresh.ms": "soon"})
    assert "invalid protocol (ftp)" in err(**{url: "ftp://idp/keys"})
    assert "doesn't exist" in err(**{url: (tmp_path / "missing.json").as_uri()})
    assert "not a file" in err(**{url: tmp_path.as_uri()})
    bad = tmp_path / "bad.json"
    for content in ("{", '{"keys": 1}', '{"keys": [{"kty": "RSA", "n": 5, "e": "AQAB"}]}', "\xff"):
        bad.write_text(content)
        assert "not a valid JSON Web Key Set" in err(**{url: bad.as_uri()})
    bad.write_bytes(b" " * (ob.MAX_JWKS_FILE_BYTES + 1))
    assert "larger than" in err(**{url: bad.as_uri()})
    assert "Not a number" in err(**{url: jwks_file.as_uri(), "sasl.oauthbearer.clock.skew.seconds": "x"})
    assert "only whitespace" in err(**{url: jwks_file.as_uri(), "sasl.oauthbearer.sub.claim.name": " "})


def test_jwks_reload_picks_up_a_rotated_key(tmp_path, keys):
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [jwk(keys["rsa"], "k1")]}))
    resolver = JwksFileKeyResolver(path)
    v = SignedJwtValidator(resolver, clock=clock)
    rotated = sign(keys["rsa-other"], {"alg": "RS256", "kid": "k2"}, jwt_claims())
    with pytest.raises(InvalidToken):
        v.validate(rotated)
    path.write_text(json.dumps({"keys": [jwk(keys["rsa"], "k1"), jwk(keys["rsa-other"], "k2")]}))
    resolver.reload()
    assert v.validate(rotated).principal_name == "svc-orders"


# --- differential: the same tokens through Kafka 3.7.1's own validators (reference kit, javac) ---------------

JAVA_PROBE = r"""
package org.apache.kafka.common.security.oauthbearer.internals.unsecured;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.*;
import java.util.function.Supplier;
import javax.security.auth.callback.Callback;
import javax.security.auth.login.AppConfigurationEntry;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerToken;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallback;
import org.apache.kafka.common.security.oauthbearer.internals.secured.*;
import org.apache.kafka.common.utils.Time;

// "unsecured <nowMs> [option=value...]" or "secured <jwks file> <skew s> <issuer|-> <aud,aud|-> <scope> <sub>";
// reads tokens, one a line; prints "OK <principal> <lifetimeMs> <sorted scope>" or "ERR <status>".
public class PykOAuthProbe {
    public static void main(String[] a) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        if (a[0].equals("unsecured")) {
            final long now = Long.parseLong(a[1]);
            Map<String, String> options = new HashMap<>();
            for (int i = 2; i < a.length; i++) options.put(a[i].split("=", 2)[0], a[i].split("=", 2)[1]);
            OAuthBearerUnsecuredValidatorCallbackHandler h = new OAuthBearerUnsecuredValidatorCallbackHandler();
            h.time(new Time() {
                public long milliseconds() { return now; }
                public long nanoseconds() { return now * 1000000L; }
                public void sleep(long ms) { }
                public void waitObject(Object o, Supplier<Boolean> c, long d) { }
            });
            h.configure(new HashMap<>(), "OAUTHBEARER", Collections.singletonList(new AppConfigurationEntry(
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule",
                AppConfigurationEntry.LoginModuleControlFlag.REQUIRED, options)));
            while ((line = in.readLine()) != null) {
                OAuthBearerValidatorCallback cb = new OAuthBearerValidatorCallback(line);
                try {
                    h.handle(new Callback[] {cb});
                    print(cb);
                } catch (Exception e) {
                    System.out.println("EXC " + e.getClass().getSimpleName());
                }
            }
        } else {
            JwksFileVerificationKeyResolver r = new JwksFileVerificationKeyResolver(Paths.get(a[1]));
            r.init();
            Set<String> aud = a[4].equals("-") ? null : new HashSet<>(Arrays.asList(a[4].split(",")));
            ValidatorAccessTokenValidator v = new ValidatorAccessTokenValidator(Integer.parseInt(a[2]), aud,
                a[3].equals("-") ? null : a[3], r, a[5], a[6]);
            while ((line = in.readLine()) != null) {
                try {
                    OAuthBearerToken t = v.validate(line);
                    System.out.println("OK " + t.principalName() + " " + t.lifetimeMs() + " " + new TreeSet<>(t.scope()));
                } catch (Exception e) {
                    System.out.println("ERR invalid_token");
                }
            }
        }
    }

    static void print(OAuthBearerValidatorCallback cb) {
        OAuthBearerToken t = cb.token();
        if (t != null) System.out.println("OK " + t.principalName() + " " + t.lifetimeMs() + " " + new TreeSet<>(t.scope()));
        else System.out.println("ERR " + cb.errorStatus());
    }
}
"""


@pytest.fixture(scope="module")
def kafka_probe(tmp_path_factory):
    import subprocess

    from tests.unit.test_security_jaas import kafka_java_probe

    java = kafka_java_probe(tmp_path_factory.mktemp("oauth-probe"), JAVA_PROBE,
                            "org.apache.kafka.common.security.oauthbearer.internals.unsecured.PykOAuthProbe",
                            ["jose4j-0.9.4.jar", "jackson-databind-2.16.2.jar", "jackson-core-2.16.2.jar",
                             "jackson-annotations-2.16.2.jar"])

    def run(args: list[str], tokens: list[str]) -> list[str]:
        done = subprocess.run(java + args, input="".join(t + "\n" for t in tokens), capture_output=True, text=True,
                              timeout=240, check=True)
        out = done.stdout.splitlines()
        assert len(out) == len(tokens), done.stderr[-3000:]
        return out

    return run


def _ours(validator, token: str) -> str:
    try:
        t = validator.validate(token)
    except InvalidToken as e:
        return f"ERR {e.status}"
    return f"OK {t.principal_name} {t.lifetime_ms} [{', '.join(sorted(t.scope))}]"


def test_unsecured_validator_agrees_with_kafkas(kafka_probe):
    options = {"unsecuredValidatorRequiredScope": "kafka", "unsecuredValidatorAllowableClockSkewMs": "1500",
               "unsecuredValidatorPrincipalClaimName": "uid"}
    cases = [
        claims(uid="u1", scope="kafka"), claims(uid="u1", scope=["kafka", "x"]), claims(uid="u1", scope=["x"]),
        claims(uid="u1", scope="kafka", exp=NOW - 1), claims(uid="u1", scope="kafka", exp=NOW - 2),
        claims(uid="u1", scope="kafka", iat=NOW + 1), claims(uid="u1", scope="kafka", iat=NOW + 2),
        claims(uid="u1", scope="kafka", exp=NOW + 0.5), claims(uid="u1", scope="kafka", exp=12.3456 + NOW),
        claims(uid=" ", scope="kafka"), claims(scope="kafka"), claims(uid=5, scope="kafka"),
        claims(uid="u1", scope=" kafka "), claims(uid="u1", scope=["kafka", " ", "kafka"]),
        claims(uid="u1", scope="kafka", exp=None), claims(uid="u1", scope="kafka", exp=True),
        claims(uid="u1", scope="kafka", iat="x"), claims(uid="u1", scope="kafka", iat=None),
        claims(uid="u1", scope=True), claims(uid="u1", scope={"a": 1}), claims(uid=["u1"], scope="kafka"),
    ]
    tokens = [unsecured(c) for c in cases] + [
        unsecured(claims(uid="u1", scope="kafka"), {"alg": "HS256"}),
        unsecured(claims(uid="u1", scope="kafka"), signature="abc"),
        unsecured(claims(uid="u1", scope="kafka"))[:-1] + "x",
        "a..b", "a.b", "abc", f"{std_b64({'alg': 'none'})}.{std_b64(b'nope')}.",
        f"{std_b64({'alg': 'none'})}.-_.", f"{std_b64({'alg': 'none', 'x': [1, True, None]})}.{std_b64(claims(uid='u1', scope='kafka'))}.",
    ]
    body = json.dumps(claims(uid="u1", scope="kafka")).encode()
    for extra in (b" x", b" {}", b"  ", b"\n", b"]"):  # Jackson's readTree stops after the first value
        tokens.append(f"{std_b64({'alg': 'none'})}.{std_b64(body + extra)}.")
    padded = base64.b64encode(body + b"  ").decode()  # two '=' of padding
    tokens += [f"{std_b64({'alg': 'none'})}.{padded}.", f"{std_b64({'alg': 'none'})}.{padded[:-1]}.",
               f"{std_b64({'alg': 'none'})}.{padded.rstrip('=')}."]
    kafkas = kafka_probe(["unsecured", str(int(NOW * 1000))] + [f"{k}={v}" for k, v in options.items()], tokens)
    ours = UnsecuredJwsValidator(options, clock=clock)
    for token, kafka in zip(tokens, kafkas):
        if kafka.startswith("EXC"):  # Kafka lets an exception escape (the connection closes): we refuse the token
            assert _ours(ours, token).startswith("ERR"), token
            continue
        assert _ours(ours, token) == kafka, token


def test_signed_validator_agrees_with_kafkas(kafka_probe, jwks_file, keys):
    import time

    now = int(time.time())
    args = ["secured", str(jwks_file), "30", "https://idp", "kafka,other", "scope", "sub"]
    ours = SignedJwtValidator.from_configs("L", {
        "sasl.oauthbearer.jwks.endpoint.url": jwks_file.as_uri(), "sasl.oauthbearer.expected.issuer": "https://idp",
        "sasl.oauthbearer.expected.audience": "kafka,other"})

    def c(**kw):
        base = {"sub": "svc", "iat": now - 10, "exp": now + 600, "iss": "https://idp", "aud": "kafka", "scope": "r w"}
        base.update(kw)
        return {k: v for k, v in base.items() if v is not None}

    rs = {"alg": "RS256", "kid": "rsa-1"}
    tokens = [
        sign(keys["rsa"], rs, c()), sign(keys["ec"], {"alg": "ES256", "kid": "ec-1"}, c(scope=["a", "b"])),
        sign(keys["rsa"], {"alg": "PS384", "kid": "rsa-1"}, c()), sign(keys["ec384"], {"alg": "ES384"}, c()),
        sign(keys["rsa"], {"alg": "RS256"}, c(aud=["x", "other"])), sign(keys["rsa"], rs, c(exp=now - 120)),
        sign(keys["rsa"], rs, c(exp=None)), sign(keys["rsa"], rs, c(iat=None)), sign(keys["rsa"], rs, c(nbf=now + 300)),
        sign(keys["rsa"], rs, c(iss="https://evil")), sign(keys["rsa"], rs, c(iss=None)),
        sign(keys["rsa"], rs, c(aud=None)), sign(keys["rsa"], rs, c(aud="nope")), sign(keys["rsa"], rs, c(sub=None)),
        sign(keys["rsa"], rs, c(sub=" ")), sign(keys["rsa"], rs, c(sub=3)), sign(keys["rsa"], rs, c(scope=["a", "a"])),
        sign(keys["rsa"], rs, c(scope=5)), sign(keys["rsa"], rs, c(scope=None)),
        sign(keys["rsa-other"], rs, c()), sign(keys["rsa"], {"alg": "RS256", "kid": "zzz"}, c()),
        sign(keys["rsa-small"], {"alg": "RS256", "kid": "small"}, c()),
        sign(keys["rsa-other"], {"alg": "RS256", "kid": "enc-only"}, c()),
        sign(keys["ec"], {"alg": "ES256", "kid": "ec-1"}, c(exp=now + 600.9, iat=now - 10.5)),
        f"{b64url(NONE_HEADER)}.{b64url(json.dumps(c()).encode())}.", "a.b.c", "not-a-jwt", "",
        sign(keys["rsa"], rs, json.dumps(c()).encode() + b" "), sign(keys["rsa"], rs, json.dumps(c()).encode() + b" x"),
        sign(keys["rsa"], rs, b"[1]"), sign(keys["rsa"], {"alg": "RS256", "kid": 5}, c()),
        sign(keys["rsa"], rs, c(exp=float(now + 600) + 0.7)), sign(keys["rsa"], rs, c(sub=" padded ")),
        sign(keys["rsa"], rs, c(scope=[" a ", "b"])), sign(keys["rsa"], rs, c(aud=["kafka", 5])),
    ]
    tokens.append(tokens[0] + "=")  # padding on the signature
    tokens.append(tokens[0].replace(".", "=.", 1))
    kafkas = kafka_probe(args, tokens)
    for token, kafka in zip(tokens, kafkas):
        assert _ours(ours, token) == kafka, token


def test_out_of_range_times_and_non_ascii_are_refused(jwks_file, keys):
    v = UnsecuredJwsValidator({}, clock=clock)
    for bad in (10 ** 400, 1e300):
        with pytest.raises(InvalidToken, match="finite number"):
            v.validate(unsecured(claims(exp=bad)))
        with pytest.raises(InvalidToken, match="finite number"):
            v.validate(unsecured(claims(iat=bad)))
    infinite_exp = b'{"sub":"a","exp":1e400}'
    huge = f"{std_b64({'alg': 'none'})}.{std_b64(infinite_exp)}."
    assert refused(unsecured_factory().new_server(), initial(huge)) == INVALID_TOKEN
    s = signed_validator(jwks_file)
    with pytest.raises(InvalidToken, match="out of range"):
        s.validate(sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"}, jwt_claims(exp=10 ** 30)))
    with pytest.raises(InvalidToken, match="not ASCII"):
        s.validate("h\u00e9.p.s")


JAVA_INITIAL_RESPONSE = r"""
package org.apache.kafka.common.security.oauthbearer.internals;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.TreeMap;

// Each stdin line (base64): OAuthBearerClientInitialResponse's reading, "OK <b64 token> <b64 authzid> <sorted
// extensions>" or "ERR".
public class PykInitialResponseProbe {
    static String b64(String s) { return Base64.getEncoder().encodeToString(s.getBytes(StandardCharsets.UTF_8)); }

    public static void main(String[] a) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            try {
                OAuthBearerClientInitialResponse r = new OAuthBearerClientInitialResponse(Base64.getDecoder().decode(line));
                StringBuilder ext = new StringBuilder();
                for (java.util.Map.Entry<String, String> e : new TreeMap<>(r.extensions().map()).entrySet())
                    ext.append(b64(e.getKey())).append('=').append(b64(e.getValue())).append(';');
                System.out.println("OK " + b64(r.tokenValue()) + " " + b64(r.authorizationId()) + " " + ext);
            } catch (Exception e) {
                System.out.println("ERR");
            }
        }
    }
}
"""


def test_initial_responses_read_as_kafka_reads_them(tmp_path):
    import subprocess

    from tests.unit.test_security_jaas import kafka_java_probe

    java = kafka_java_probe(tmp_path, JAVA_INITIAL_RESPONSE,
                            "org.apache.kafka.common.security.oauthbearer.internals.PykInitialResponseProbe", [])
    rng = random.Random(7628)
    pieces = [b"n,", b",", b"a=", b"alice", b"=2C", b"=3D", b"=", b"\x01", b"auth", b"auth=Bearer ", b"Bearer",
              b" ", b"tok.en-_", b"x=y", b"k=v v", b"\t", b"\xff", b"\xc3\xa9", b"1", b"bearer  t"]
    messages = [initial("abc.def.ghi"), initial("t", "alice", a="1", B="x y"),
                b"n,a=a=2Cb,\x01auth=BEARER t\x01\x01", b"n,,\x01auth=Bearer t\x01auth=Bearer u\x01\x01"]
    messages += [b"n,," + b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8))) + b"\x01\x01"
                 for _ in range(100)]
    authzids = [b"", b"a=alice", b"a=a=2Cb", b"a=x=y", b"a=", b"a=\xc3\xa9"]
    kvs = [b"auth=Bearer tok.en", b"auth=bearer  t-_", b"auth=Basic x", b"x=y", b"k=v v", b"K=\t", b"1=2",
           b"auth=Bearer a b", b"=v", b"k=", b"k=\xc3\xa9", b"auth=Bearer t", b"auth=Bearer t", b"kK=a=b"]
    messages += [b"n," + rng.choice(authzids) + b",\x01"
                 + b"".join(rng.choice(kvs) + b"\x01" for _ in range(rng.randint(0, 3)))
                 + rng.choice([b"\x01", b"\x01", b"", b"\x01\x01"]) for _ in range(300)]
    messages += [b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 8))) for _ in range(200)]
    done = subprocess.run(java, input="".join(base64.b64encode(m).decode() + "\n" for m in messages),
                          capture_output=True, text=True, timeout=240, check=True)
    kafkas = done.stdout.splitlines()
    assert len(kafkas) == len(messages), done.stderr[-3000:]
    assert sum(k.startswith("OK") for k in kafkas) >= 10

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    for m, k in zip(messages, kafkas):
        try:
            r = parse_client_initial_response(m)
            ext = "".join(f"{b64(a)}={b64(b)};" for a, b in sorted(r.extensions.items()))
            ours = f"OK {b64(r.token)} {b64(r.authorization_id)} {ext}"
        except InvalidClientResponse:
            ours = "ERR"
        assert ours.rstrip() == k.rstrip(), m


# --- KIP-768: signed JWTs against a JWKS URL (Kafka's RefreshingHttpsJwks) -------------------------------------

class JwksServer:
    """A real HTTP server on 127.0.0.1 serving ``document`` (changeable), counting the requests; ``fail`` makes
    it answer 500."""

    def __init__(self, document: dict) -> None:
        import http.server
        import threading

        self.document, self.requests, self.fail = document, 0, False
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.requests += 1
                body = b"oops" if outer.fail else json.dumps(outer.document).encode()
                self.send_response(500 if outer.fail else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait_for(condition, what: str, timeout_s: float = 20.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_jwks_url_is_fetched_at_start_and_a_rotated_key_is_taken_after_one_refused_token(keys):
    server = JwksServer({"keys": [jwk(keys["rsa"], "rsa-1")]})
    try:
        v = SignedJwtValidator.from_configs("SASL_SSL", {"sasl.oauthbearer.jwks.endpoint.url": server.url},
                                            clock=clock)
        try:
            assert server.requests == 1
            ok = sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"}, jwt_claims())
            assert v.validate(ok).principal_name == "svc-orders"
            assert server.requests == 1  # validation never touches the network
            # the identity provider rotates to a new key: the first token signed with it is refused and asks for
            # a refresh at once; once that is done the key is known
            server.document = {"keys": [jwk(keys["rsa"], "rsa-1"), jwk(keys["rsa-other"], "rsa-2")]}
            rotated = sign(keys["rsa-other"], {"alg": "RS256", "kid": "rsa-2"}, jwt_claims(sub="svc-new"))
            with pytest.raises(InvalidToken, match=f"from JWKs obtained from {server.url}"):
                v.validate(rotated)
            wait_for(lambda: v.resolver.refreshes == 1, "the expedited refresh")
            assert v.validate(rotated).principal_name == "svc-new"
            # an unknown kid asks once a minute at most: a flood of forged kids cannot hammer the provider
            forged = sign(keys["rsa-other"], {"alg": "RS256", "kid": "nope"}, jwt_claims())
            for _ in range(50):
                with pytest.raises(InvalidToken):
                    v.validate(forged)
            wait_for(lambda: v.resolver.refreshes == 2, "the refresh for the unknown kid")
            assert server.requests == 3
            assert not v.resolver.maybe_expedite_refresh("x" * 1001)  # never cached
        finally:
            v.resolver.close()
    finally:
        server.close()


def test_a_failed_refresh_keeps_the_keys_it_had(keys, caplog):
    server = JwksServer({"keys": [jwk(keys["rsa"], "rsa-1")]})
    try:
        v = SignedJwtValidator.from_configs("SASL_SSL", {
            "sasl.oauthbearer.jwks.endpoint.url": server.url,
            "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms": "1",
            "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms": "20"}, clock=clock)
        try:
            server.fail = True
            assert v.resolver.maybe_expedite_refresh("rsa-9")
            wait_for(lambda: "encountered an error" in caplog.text, "the failed refresh's warning")
            assert server.requests >= 2  # retried before giving up
            ok = sign(keys["rsa"], {"alg": "RS256", "kid": "rsa-1"}, jwt_claims())
            assert v.validate(ok).principal_name == "svc-orders"
        finally:
            v.resolver.close()
    finally:
        server.close()
