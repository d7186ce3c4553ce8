"""The `onceflow` tools' failures: the errors a user can act on, reported as one line on stderr
(exit 1 for a failure, 2 for a bad argument) by the command line's root group
(cli/root_group.py)."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from onceflow.kafka_errors import kafka_error


class CliError(Exception):
    """A failure the user can act on: reported as one line on stderr."""

    exit_code = 1


class UsageError(CliError):
    """A bad argument, found after click's own parsing (same exit code as click's)."""

    exit_code = 2


class BrokerUnreachableError(CliError):
    """No broker answered at the bootstrap address."""


class TopicNotFoundError(CliError):
    """The named topic does not exist."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"Topic '{topic}' does not exist.")


def kafka_error_text(error: KafkaError | KafkaException) -> str:
    """One readable line for a Kafka error: the message and Kafka's error name."""
    if isinstance(error, KafkaException):
        carried = kafka_error(error)
        if carried is None:
            return str(error)
        error = carried
    text = error.str().rstrip(".")
    return f"{text} ({error.name()})"


def error_text(error: CliError | KafkaException | OSError) -> str:
    """One line for a failure: Kafka's error name for a Kafka exception, else the message."""
    return kafka_error_text(error) if isinstance(error, KafkaException) else str(error)
