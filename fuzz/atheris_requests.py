"""Atheris entry point for long runs of the request parser (hypothesis covers CI).

    pip install atheris
    python -m tests.fuzz.request_corpus fuzz/corpus-requests   # valid frames, every advertised
                                                              # version (the tests' strategies)
    python fuzz/atheris_requests.py -max_total_time=3600 fuzz/corpus-requests

An input is a request frame without its size prefix, as `parse_request` takes it. Only
ProtocolError subclasses may come out of the parser, and only RecordsError subclasses out of
the produce validation of a Produce request's records.
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports():
    from onceflow.broker.dispatch import supported_versions
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


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
