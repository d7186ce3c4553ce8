"""The demo's topic reader against a restarting broker's ListOffsets answers: a partition
left without an offset (librdkafka's -1001) is asked again, never read as an empty one."""

from __future__ import annotations

import pytest

from onceflow.pipelines import topic_reader
from tests.scripted_admin import UNSET, ScriptedAdmin


def scripted(monkeypatch: pytest.MonkeyPatch, answers: list[dict[int, int]]) -> ScriptedAdmin:
    admin = ScriptedAdmin(answers)
    monkeypatch.setattr(topic_reader, "AdminClient", lambda _config: admin)
    monkeypatch.setattr(topic_reader.time, "sleep", lambda _s: None)
    return admin


def test_an_end_offset_left_unset_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = scripted(monkeypatch, [{0: UNSET, 1: 40}, {0: UNSET, 1: 40}, {0: 37, 1: 40}])
    assert topic_reader.end_offsets("127.0.0.1:1", "t") == {0: 37, 1: 40}
    assert admin.calls == 3


def test_an_end_offset_unset_until_the_deadline_is_a_read_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scripted(monkeypatch, [{0: UNSET}] * 2)
    with pytest.raises(topic_reader.ReadTimeoutError, match="no offset"):
        topic_reader.end_offsets("127.0.0.1:1", "t", timeout=0)
