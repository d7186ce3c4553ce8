"""Atheris entry point for long runs of the request parser (hypothesis covers CI).

    pip install atheris
    python fuzz/atheris_requests.py --make-corpus fuzz/corpus-requests   # valid frames, every
                                                                        # advertised version
    python fuzz/atheris_requests.py -max_total_time=3600 fuzz/corpus-requests

An input is a request frame without its size prefix, as `parse_request` takes it. Only
ProtocolError subclasses may come out of the parser, and only RecordsError subclasses out of
the produce validation of a Produce request's records.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from onceflow.broker.dispatch import supported_versions
    from onceflow.broker.server import Broker  # noqa: F401  (registers the handlers)
    from onceflow.protocol.errors import ProtocolError
    from onceflow.protocol.messages import parse_request
    from onceflow.records.errors import RecordsError
    from onceflow.records.validation import validate_produce

SUPPORTED = supported_versions()


def test_one_input(data: bytes) -> None:
    try:
        request = parse_request(data, SUPPORTED)
    except ProtocolError:
        return
    if request.api_key == 0:
        for topic in request.body.topic_data:
            for partition in topic.partition_data:
                if partition.records:
                    with contextlib.suppress(RecordsError):
                        validate_produce(partition.records, deep=True)


def make_corpus(directory: Path, per_version: int = 3) -> None:
    """Valid requests of every advertised API version, built as the hypothesis tests build
    them (run from the repository root, with the dev dependencies installed)."""
    from hypothesis import HealthCheck, given, settings

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.fuzz.test_fuzz_requests import PARSEABLE, _entities, frame_of

    directory.mkdir(parents=True, exist_ok=True)
    for key, version, cls in PARSEABLE:
        frames: list[bytes] = []
        examples = settings(
            max_examples=per_version, database=None, suppress_health_check=list(HealthCheck)
        )
        examples(given(_entities(cls))(_collector(frames, frame_of)))()
        for i, frame in enumerate(frames):
            (directory / f"api{key}-v{version}-{i}").write_bytes(frame)


def _collector(
    frames: list[bytes], frame_of: Callable[[object], bytes]
) -> Callable[[object], None]:
    def collect(body: object) -> None:
        frames.append(frame_of(body))

    return collect


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make-corpus":
        make_corpus(Path(sys.argv[2]))
        sys.exit(0)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
