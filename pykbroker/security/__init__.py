"""Security: who a connection is (authentication - TLS principals, SASL mechanisms) and what it may do
(authorization - Kafka's ACL model, the authorizer and its ACL cache, and how ACLs are stored), each with
Kafka 3.7's ZooKeeper mode as the reference and configured by Kafka's own property names."""
