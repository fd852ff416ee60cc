"""Kafka error codes as one enum (kio's, generated from Kafka's own list) and the exception that carries one."""

from kio.schema.errors import ErrorCode

__all__ = ["ErrorCode", "KafkaError"]


class KafkaError(Exception):
    """A failure that maps to one Kafka error code; handlers turn it into that code at the right level."""

    def __init__(self, code: ErrorCode, message: str | None = None):
        super().__init__(message or code.name)
        self.code = code
        self.message = message
