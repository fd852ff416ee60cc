"""Security building blocks of the broker (issue 19): who a connection is (``principal``: Kafka principals and
TLS subject mapping; ``tls`` and ``keystores``: TLS contexts from Kafka's ssl.* settings, reloadable; ``jaas``
parses Kafka's JAAS strings; ``sasl/`` holds one server-side state machine per SASL mechanism; ``credentials``
the SCRAM credentials as Kafka stores them), what it may do (``acl``: Kafka's ACL model; ``authorizer``: the
decision function and its ACL cache; ``acl_store``: how ACLs are stored) and how much it may use (``quotas``:
Kafka's client-quota arithmetic; ``quota_store``: how quotas are stored and altered). Every rule follows Apache
Kafka 3.7 in ZooKeeper mode and reads Kafka's own property names; no module here logs or formats a password,
token or SCRAM proof. Not yet wired into the connection or the handlers.
"""
