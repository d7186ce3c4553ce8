"""Apache Kafka's own command-line tools, run through their main classes from the fetched jars
(what bin/kafka-*.sh run), and readers for the tables and JSON lines they print."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.apache_kafka import Distribution

TOPICS = "org.apache.kafka.tools.TopicCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"
CONFIGS = "org.apache.kafka.tools.ConfigCommand"
ACLS = "org.apache.kafka.tools.AclCommand"
GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell"
DELETE_RECORDS = "org.apache.kafka.tools.DeleteRecordsCommand"
PRODUCER_PERF_TEST = "org.apache.kafka.tools.ProducerPerformance"
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"

TOOL_TIMEOUT_S = 180.0
# The tools' log lines go to stderr at WARN (as config/tools-log4j2.yaml does for bin/*.sh),
# so stdout holds only what the tool prints.
LOG4J2 = """\
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = STDERR
"""


@dataclass(frozen=True)
class Ran:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def lines(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.strip()]


@dataclass(frozen=True)
class KafkaTools:
    """Kafka's tools pointed at one broker (`bootstrap`), each run as its own JVM."""

    distribution: Distribution
    bootstrap: str
    log4j2: Path

    def run(
        self, main: str, *args: str, stdin: str | None = None, timeout: float = TOOL_TIMEOUT_S
    ) -> Ran:
        command = self.distribution.command(
            main, *args, options=(f"-Dlog4j2.configurationFile={self.log4j2}",)
        )
        done = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        return Ran(tuple(args), done.returncode, done.stdout, done.stderr)

    def ok(self, main: str, *args: str, stdin: str | None = None) -> Ran:
        """The run, asserted to have exited 0 (the failure shows both streams)."""
        ran = self.run(main, *args, stdin=stdin)
        assert ran.returncode == 0, (
            f"{main} {args}: exit {ran.returncode}\n{ran.stdout}\n{ran.stderr}"
        )
        return ran


def write_log4j2(directory: Path) -> Path:
    path = directory / "tools-log4j2.properties"
    path.write_text(LOG4J2)
    return path


def tab_table(text: str) -> list[dict[str, str]]:
    """kafka-transactions' tables: a tab-separated header line, then rows (padded cells)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [cell.strip() for cell in lines[0].split("\t") if cell.strip()]
    rows = []
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.split("\t")]
        rows.append(dict(zip(header, cells, strict=False)))
    return rows


def space_table(text: str, header_start: str) -> list[dict[str, str]]:
    """kafka-consumer-groups' tables: a header line starting with `header_start`, columns
    padded with spaces (no cell holds a space, as in the tables read here)."""
    lines = [line for line in text.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith(header_start):
            header = line.split()
            return [dict(zip(header, row.split(), strict=False)) for row in lines[index + 1 :]]
    raise AssertionError(f"no table headed {header_start!r} in:\n{text}")


def json_events(text: str) -> list[dict[str, Any]]:
    """The JSON lines the verifiable producer and consumer print, one event each."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
