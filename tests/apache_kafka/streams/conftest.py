"""Kafka Streams tests: WordCount.java compiled once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.apache_kafka import Distribution
from tests.apache_kafka.streams.word_count import compile_word_count


@pytest.fixture(scope="session")
def word_count_classes(
    apache_kafka: Distribution, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    return compile_word_count(apache_kafka, tmp_path_factory.mktemp("word-count-classes"))
