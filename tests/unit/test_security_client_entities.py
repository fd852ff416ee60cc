"""security/client_entities.py: each kind of client entity config reaches the credential cache and the quotas."""

from __future__ import annotations

import logging

from pykbroker.security.client_entities import apply_client_entity
from pykbroker.security.credentials import ScramCredentialCache, generate_credential, user_config_with
from pykbroker.security.quotas import DEFAULT, ClientQuotas, QuotaEntity


def test_each_entity_kind_reaches_its_enforcer_and_bad_input_changes_nothing(caplog):
    credentials, quotas = ScramCredentialCache(), ClientQuotas()
    alice = user_config_with({"producer_byte_rate": "100"}, "SCRAM-SHA-512", generate_credential("SCRAM-SHA-512", "pw"))
    apply_client_entity("users/alice%40x", alice, credentials, quotas)
    assert credentials.get("SCRAM-SHA-512", "alice@x") is not None
    assert quotas.entity_config(QuotaEntity("alice@x", None)) == {"producer_byte_rate": "100"}  # no credential in it
    apply_client_entity("users/<default>/clients/<default>", {"consumer_byte_rate": "7"}, credentials, quotas)
    assert quotas.entity_config(QuotaEntity(DEFAULT, DEFAULT)) == {"consumer_byte_rate": "7"}
    assert credentials.users() == ["alice@x"]  # a default user holds no credential
    with caplog.at_level(logging.WARNING):
        apply_client_entity("users/alice%40x", {"producer_byte_rate": "lots"}, credentials, quotas)
        apply_client_entity("groups/g", {"a": "b"}, credentials, quotas)
        apply_client_entity("ips/127.0.0.1", {"connection_creation_rate": "5"}, credentials, quotas)
    assert quotas.entity_config(QuotaEntity("alice@x", None)) == {"producer_byte_rate": "100"}  # kept
    assert "groups/g" in caplog.text
    # the user's config without SCRAM keys removes the credential even though its quota value was unreadable
    assert credentials.get("SCRAM-SHA-512", "alice@x") is None
