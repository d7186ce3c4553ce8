"""A seed corpus for the long atheris runs of the request parser (fuzz/atheris_requests.py):
valid requests of every advertised API version, built as the hypothesis tests build them.

    python -m tests.fuzz.request_corpus fuzz/corpus-requests   # from the repository root
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from tests.fuzz.test_fuzz_requests import PARSEABLE, entities, frame_of


def make_corpus(directory: Path, per_version: int = 3) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for key, version, cls in PARSEABLE:
        frames: list[bytes] = []
        examples = settings(
            max_examples=per_version, database=None, suppress_health_check=list(HealthCheck)
        )
        examples(given(entities(cls))(_collector(frames, frame_of)))()
        for i, frame in enumerate(frames):
            (directory / f"api{key}-v{version}-{i}").write_bytes(frame)


def _collector(
    frames: list[bytes], frame_of: Callable[[object], bytes]
) -> Callable[[object], None]:
    def collect(body: object) -> None:
        frames.append(frame_of(body))

    return collect


if __name__ == "__main__":
    make_corpus(Path(sys.argv[1]))
