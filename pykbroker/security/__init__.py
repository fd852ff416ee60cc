"""Security building blocks of the broker (issue 19): authentication (``jaas`` parses Kafka's JAAS strings,
``sasl/`` holds one server-side state machine per SASL mechanism, ``credentials`` the SCRAM credentials as
Kafka stores them), and authorization and quotas beside them. Every rule follows Apache Kafka 3.7 in ZooKeeper
mode and reads Kafka's own property names; no module here logs or formats a password, token or SCRAM proof.
"""
