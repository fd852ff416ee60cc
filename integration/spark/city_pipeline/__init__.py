"""The city-events pipeline: JSON events keyed by city, counted per city per event-time window on Spark.

Modules, one concern each:
  events      the event format and a deterministic event maker (pure Python, no Spark)
  producer    writing events to Kafka with kafka-python or confluent-kafka, topic creation
  transforms  the pipeline's logic as functions from DataFrame to DataFrame (no sources, no sinks)
  replay      the batch replay job's offset-range options (pure Python)
  wiring      source and sink wiring: spark.read/readStream.format("kafka"), the kafka and parquet sinks
  session     building a SparkSession with the Kafka connector from Maven or from a directory of jars

Only the Kafka source and sink in `wiring` need the spark-sql-kafka-0-10 connector at run time; the rest
runs on a plain pyspark install (events, producer, replay and cli not even that), which is how the tests
exercise the pipeline's logic without the connector.
"""
