"""pytest plugin: a real pykbroker for application tests (the kafka_broker fixture). Filled in by issue 11."""
