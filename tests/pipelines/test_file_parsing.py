"""file-transactions parsing and the word count checker, without Spark."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from onceflow.pipelines.file_transactions import records_of
from onceflow.pipelines.topic_reader import ReadRecord
from onceflow.pipelines.wordcount_check import check_counts, words_of


def test_csv_and_json_lines_become_transactions(tmp_path: Path) -> None:
    csv_file = tmp_path / "a.csv"
    csv_file.write_text("id,amount,account\nt1,10.5,acme\nt2,3,globex\n")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text('{"id": "t3", "amount": "7"}\n\n{"id": "t4", "amount": 1}\n')
    out = records_of(str(csv_file), "tx", "dlq") + records_of(jsonl.as_uri(), "tx", "dlq")
    assert [(t, k) for t, k, _ in out] == [
        ("tx", b"t1"),
        ("tx", b"t2"),
        ("tx", b"t3"),
        ("tx", b"t4"),
    ]
    first = json.loads(out[0][2])
    assert first == {
        "id": "t1",
        "amount": 10.5,
        "account": "acme",
        "source": str(csv_file),
        "source_line": 1,
    }


def test_bad_files_become_one_dead_letter_with_the_reason(tmp_path: Path) -> None:
    cases = {
        "missing.csv": None,
        "bad-amount.csv": "id,amount\nt1,lots\n",
        "no-id.jsonl": '{"amount": 3}\n',
        "not-json.jsonl": '{"id": "t1", "amount": 1}\n{oops\n',
        "short-row.csv": "id,amount,x\nt1,2\n",
        "data.txt": "id,amount\n",
    }
    reasons = {}
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        [(topic, key, value)] = records_of(str(path), "tx", "dlq")
        assert topic == "dlq" and key == str(path).encode()
        reasons[name] = json.loads(value)["error"]
    assert "cannot read" in reasons["missing.csv"]
    assert "not a number" in reasons["bad-amount.csv"]
    assert "no transaction id" in reasons["no-id.jsonl"]
    assert "line 2: invalid JSON" in reasons["not-json.jsonl"]
    assert "wrong number of fields" in reasons["short-row.csv"]
    assert "unknown file type" in reasons["data.txt"]


def test_word_count_checker_flags_duplicates_and_missing_counts() -> None:
    truth = Counter(words_of("a b a c"))
    exact = [
        ReadRecord(0, 0, b"a", b"1"),
        ReadRecord(0, 1, b"b", b"1"),
        ReadRecord(0, 2, b"a", b"2"),
        ReadRecord(1, 0, b"c", b"1"),
    ]
    assert check_counts(truth, exact).exact
    replayed = [*exact[:3], ReadRecord(0, 3, b"a", b"2"), exact[3]]
    report = check_counts(truth, replayed)
    assert (report.duplicates, report.missing, report.exact) == (1, 0, False)
    short = check_counts(truth, exact[:3])
    assert (short.missing, short.wrong_words, short.exact) == (1, 1, False)
    assert short.line("x") == "x: expected=4 counted=3 duplicates=0 missing=1"
