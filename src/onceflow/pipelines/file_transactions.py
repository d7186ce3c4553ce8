"""Files of transactions into a topic, exactly once per file (the Kafka-to-Kafka job of the
exactly-once literature).

Each record of the input topic names a file: a path, a `file://` URL or an `http(s)://` URL.
The file is read and parsed into transaction records, CSV with a header row (`.csv`) or JSON
lines (`.jsonl`, `.ndjson`, `.json`); each record needs an `id` and a numeric `amount`. All of
a file's records go to the transactions topic in the same Kafka transaction as the input offset
that named it, so a file is written whole, once. A file that cannot be read or parsed goes to
the dead-letter topic instead, as one record with the reason.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.json_lines import JsonLineError, json_lines
from onceflow.pipelines.session import (
    PipelineOptions,
    add_common_arguments,
    pipeline,
    run_pipeline,
)

FETCH_TIMEOUT_S = 30
OUTPUT_SCHEMA = "topic string, key binary, value binary"


class BadFileError(ValueError):
    """Why a file went to the dead-letter topic."""


def fetch(location: str) -> bytes:
    parsed = urllib.parse.urlparse(location)
    try:
        if parsed.scheme in ("http", "https"):
            with urllib.request.urlopen(location, timeout=FETCH_TIMEOUT_S) as response:
                return response.read()
        if parsed.scheme == "file":
            return Path(urllib.request.url2pathname(parsed.path)).read_bytes()
        if parsed.scheme:
            raise BadFileError(f"unsupported URL scheme {parsed.scheme!r}")
        return Path(location).read_bytes()
    except OSError as e:
        raise BadFileError(f"cannot read: {e.strerror or e}") from None


def _transaction(record: dict[str, object], where: str) -> dict[str, object]:
    if not str(record.get("id") or "").strip():
        raise BadFileError(f"{where}: no transaction id")
    try:
        record["amount"] = float(str(record.get("amount")))
    except ValueError:
        raise BadFileError(f"{where}: amount {record.get('amount')!r} is not a number") from None
    return record


def _json_transaction(number: int, value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise BadFileError(f"line {number}: not a JSON object")
    return _transaction(value, f"line {number}")


def parse(location: str, data: bytes) -> list[dict[str, object]]:
    suffix = Path(urllib.parse.urlparse(location).path).suffix.lower()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadFileError("not UTF-8 text") from None
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames:
            raise BadFileError("CSV without a header row")
        rows = []
        for row in reader:
            if None in row or None in row.values():
                raise BadFileError(f"line {reader.line_num}: wrong number of fields")
            rows.append(_transaction(dict(row), f"line {reader.line_num}"))
        return rows
    if suffix in (".jsonl", ".ndjson", ".json"):
        try:
            return [
                _json_transaction(number, value) for number, value in json_lines(text.splitlines())
            ]
        except JsonLineError as e:
            raise BadFileError(f"line {e.line}: invalid JSON ({e.error.msg})") from None
    raise BadFileError(f"unknown file type {suffix or '(none)'!r}: expected .csv or .jsonl")


def records_of(
    location: str, transactions: str, dead_letters: str
) -> list[tuple[str, bytes, bytes]]:
    """(topic, key, value) records for one file: its transactions, or one dead letter."""
    try:
        rows = parse(location, fetch(location))
    except BadFileError as e:
        reason = json.dumps({"location": location, "error": str(e)}, sort_keys=True)
        return [(dead_letters, location.encode(), reason.encode())]
    out = []
    for line, row in enumerate(rows, 1):
        row = {**row, "source": location, "source_line": line}
        out.append(
            (transactions, str(row["id"]).encode(), json.dumps(row, sort_keys=True).encode())
        )
    return out


def parse_files(transactions: str, dead_letters: str):
    def apply(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            topics, keys, values = [], [], []
            for raw in batch.column(0).to_pylist():
                location = (raw or b"").decode("utf-8", "replace").strip()
                for topic, key, value in records_of(location, transactions, dead_letters):
                    topics.append(topic)
                    keys.append(key)
                    values.append(value)
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(topics, pa.string()),
                    pa.array(keys, pa.binary()),
                    pa.array(values, pa.binary()),
                ],
                ["topic", "key", "value"],
            )

    return apply


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="file-transactions", description=__doc__.splitlines()[0])
    add_common_arguments(p, input_topic="file-locations", output_topic="transactions")
    p.add_argument("--dead-letters", default="transactions-dead-letters")
    return p


@pipeline
def start(spark: SparkSession, options: PipelineOptions, dead_letters: str) -> StreamingQuery:
    """Each file named on the input topic into the output topic, or to `dead_letters`."""
    out = (
        options.source(spark)
        .select("value")
        .mapInArrow(parse_files(options.output_topic, dead_letters), OUTPUT_SCHEMA)
    )
    return options.start_sink(out, topic_column=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    run_pipeline(start, "onceflow-file-transactions", args, dead_letters=args.dead_letters)


if __name__ == "__main__":
    main()
