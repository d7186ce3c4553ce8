"""Checking a word count's output against the truth: the counts a read_committed reader ends
with, and the output records that repeat one already seen (what at-least-once adds)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from onceflow.pipelines.topic_reader import ReadRecord

_WORD = re.compile(r"[^a-z0-9']+")


def words_of(sentence: str) -> list[str]:
    """The pipeline's tokenization (see wordcount.word_counts)."""
    return [w for w in _WORD.split(sentence.lower()) if w]


@dataclass(frozen=True)
class CountReport:
    expected: int  # words produced
    counted: int  # sum of the final count of each word
    duplicates: int  # output records repeating a (word, count) already written
    missing: int  # words short of their true count
    wrong_words: int  # words whose final count differs from the truth

    @property
    def exact(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.wrong_words == 0

    def line(self, label: str) -> str:
        return (
            f"{label}: expected={self.expected} counted={self.counted} "
            f"duplicates={self.duplicates} missing={self.missing}"
        )


def check_counts(truth: Counter[str], output: Iterable[ReadRecord]) -> CountReport:
    final: dict[str, int] = {}
    seen: set[tuple[str, int]] = set()
    duplicates = 0
    for record in sorted(output, key=lambda r: (r.partition, r.offset)):
        word = (record.key or b"").decode()
        count = int(record.value or b"0")
        if (word, count) in seen:
            duplicates += 1
        seen.add((word, count))
        final[word] = count
    missing = sum(max(0, n - final.get(w, 0)) for w, n in truth.items())
    wrong = sum(1 for w in truth.keys() | final.keys() if truth.get(w, 0) != final.get(w, 0))
    return CountReport(sum(truth.values()), sum(final.values()), duplicates, missing, wrong)
