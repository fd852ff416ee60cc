"""Spark's stock Kafka connector over a SASL_PLAINTEXT listener: only Spark's own `kafka.security.protocol`,
`kafka.sasl.mechanism` and `kafka.sasl.jaas.config` options added (PLAIN for the sink, SCRAM-SHA-256 for the
source, whose credentials are stored with AlterUserScramCredentials); the rows written are read back."""

from __future__ import annotations

from spark_guard import require_connector

require_connector()

import pytest  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion,
)

from broker_process import BrokerProcess, free_port  # noqa: E402

pytestmark = pytest.mark.timeout(300)
MODULE = "org.apache.kafka.common.security"


def test_spark_writes_and_reads_over_sasl(spark, tmp_path, unique_name):
    plain, sasl = free_port(), free_port()
    config = {"listeners": f"PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}",
              "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
              "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                  f'{MODULE}.plain.PlainLoginModule required user_writer="writer-pw";',
              "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
                  f"{MODULE}.scram.ScramLoginModule required;",
              "num.partitions": 2}
    with BrokerProcess(tmp_path / "broker", config=config, port=plain) as broker:
        upsertion = UserScramCredentialUpsertion("reader", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                                 b"reader-pw")
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for future in admin.alter_user_scram_credentials([upsertion]).values():
            future.result(timeout=60)
        bootstrap = f"127.0.0.1:{sasl}"
        writer = {"kafka.bootstrap.servers": bootstrap, "kafka.security.protocol": "SASL_PLAINTEXT",
                  "kafka.sasl.mechanism": "PLAIN",
                  "kafka.sasl.jaas.config": f'{MODULE}.plain.PlainLoginModule required username="writer" '
                                            f'password="writer-pw";'}
        reader = {"kafka.bootstrap.servers": bootstrap, "kafka.security.protocol": "SASL_PLAINTEXT",
                  "kafka.sasl.mechanism": "SCRAM-SHA-256",
                  "kafka.sasl.jaas.config": f'{MODULE}.scram.ScramLoginModule required username="reader" '
                                            f'password="reader-pw";'}
        rows = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(20)], ["key", "value"])
        rows.write.format("kafka").options(**writer).option("topic", unique_name).save()
        read = (spark.read.format("kafka").options(**reader).option("subscribe", unique_name)
                .option("startingOffsets", "earliest").load())
        values = sorted(row.value.decode() for row in read.select("value").collect())
        assert values == sorted(f"v{i}" for i in range(20))
        assert "principal User:reader" in broker.log_path.read_text(errors="replace")
