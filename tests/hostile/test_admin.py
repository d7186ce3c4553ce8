"""Admin requests and the data directory, against real brokers.

A data directory the broker did not make is never used, and nothing the broker did not make is
ever deleted; creating and deleting topics is all or nothing, even across kill -9 or a failure
half-way; a big CreateTopics does not stall other clients; bad names and configs get Kafka's
error codes.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kio.schema.create_topics.v7.request import (
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
)
from kio.schema.delete_topics.v6.request import DeleteTopicsRequest, DeleteTopicState
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from onceflow.broker.embedded import EmbeddedBroker
from tests.wire import WireClient, api_versions, good_batch, produce_errors

WAIT = 30.0
BROKER_COMMAND = (sys.executable, "-m", "onceflow.cli.main", "broker")
MakeBroker = Callable[..., EmbeddedBroker]


def creatable(name: str, partitions: int = 1, **configs: str) -> CreatableTopic:
    return CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=-1,
        assignments=(),
        configs=tuple(CreatableTopicConfig(name=k, value=v) for k, v in configs.items()),
    )


def create_topics(address: str, *topics: CreatableTopic) -> dict[str, ErrorCode]:
    client = WireClient(address, timeout=120)
    try:
        response = client.call(
            CreateTopicsRequest(
                topics=topics, timeout=datetime.timedelta(seconds=WAIT), validate_only=False
            )
        )
    finally:
        client.close()
    return {t.name: t.error_code for t in response.topics}


def delete_topics(address: str, *names: str) -> dict[str, ErrorCode]:
    client = WireClient(address)
    try:
        response = client.call(
            DeleteTopicsRequest(
                topics=tuple(DeleteTopicState(name=n, topic_id=None) for n in names),
                timeout=datetime.timedelta(seconds=WAIT),
            )
        )
    finally:
        client.close()
    return {t.name: t.error_code for t in response.responses}


def metadata(address: str, names: list[str] | None = None) -> Any:
    client = WireClient(address)
    try:
        return client.call(
            MetadataRequest(
                topics=None
                if names is None
                else tuple(MetadataRequestTopic(topic_id=None, name=n) for n in names),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )
    finally:
        client.close()


def topic_names(address: str) -> set[str]:
    return {t.name for t in metadata(address).topics}


def assert_answers(broker: EmbeddedBroker) -> None:
    """The broker is alive and serves another client."""
    assert broker.process is not None and broker.process.poll() is None
    assert 19 in api_versions(broker.bootstrap)


def entries(data_dir: Path) -> set[str]:
    return {p.name for p in data_dir.iterdir()}


def wait_exit(broker: EmbeddedBroker) -> None:
    assert broker.process is not None
    broker.process.wait(WAIT)


# -- the data directory ------------------------------------------------------------------------


def test_a_directory_the_broker_did_not_make_is_refused_and_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "mine"
    (data / "photos-2023").mkdir(parents=True)
    (data / "photos-2023" / "beach.jpg").write_bytes(b"jpeg")
    (data / "backup-1").mkdir()
    (data / "notes.txt").write_text("keep me")
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    run = subprocess.run(
        [*BROKER_COMMAND, "--data-dir", str(data), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr  # one line, no traceback
    assert "not empty" in lines[0] and "meta.properties" in lines[0] and str(data) in lines[0]
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before
    assert (data / "photos-2023" / "beach.jpg").read_bytes() == b"jpeg"


def test_a_new_directory_gets_meta_properties(make_broker: MakeBroker, tmp_path: Path) -> None:
    broker = make_broker(tmp_path / "fresh")
    props = dict(
        line.split("=", 1) for line in (tmp_path / "fresh" / "meta.properties").read_text().split()
    )
    assert props["version"] == "1" and props["node.id"] == "0"
    assert len(props["cluster.id"]) == 22
    assert metadata(broker.bootstrap).cluster_id == props["cluster.id"]
    broker.restart()
    assert metadata(broker.bootstrap).cluster_id == props["cluster.id"]


def test_a_data_directory_of_an_earlier_version_keeps_working(
    make_broker: MakeBroker, tmp_path: Path, topic_name: str
) -> None:
    data = tmp_path / "old"
    broker = make_broker(data)
    assert create_topics(broker.bootstrap, creatable(topic_name, 2)) == {topic_name: 0}
    broker.stop()
    # What onceflow wrote before node.id was recorded.
    (data / "meta.properties").write_text("version=1\ncluster.id=0123456789abcdef012345\n")
    broker.start()
    assert metadata(broker.bootstrap).cluster_id == "0123456789abcdef012345"
    assert topic_name in topic_names(broker.bootstrap)
    assert "node.id=0" in (data / "meta.properties").read_text()


def test_directories_the_broker_did_not_make_survive_restarts(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = make_broker(data)
    (data / "photos-2023").mkdir()
    (data / "backup-1").mkdir()
    (data / "backup-1" / "db.dump").write_bytes(b"dump")
    broker.restart()  # kill -9 then start: the unclean path
    broker.stop()
    broker.start()
    assert {"photos-2023", "backup-1"} <= entries(data)
    assert (data / "backup-1" / "db.dump").read_bytes() == b"dump"
    # A topic whose directory would be a user's is refused, and the user's directory kept.
    assert create_topics(broker.bootstrap, creatable("backup", 2)) == {
        "backup": ErrorCode.kafka_storage_error
    }
    assert (data / "backup-1" / "db.dump").read_bytes() == b"dump"
    assert not (data / "backup-0").exists()
    assert_answers(broker)


# -- all or nothing --------------------------------------------------------------------------


def test_kill_between_creating_and_recording_leaves_nothing(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = make_broker(data)
    (data / "keep-7").mkdir()
    assert create_topics(broker.bootstrap, creatable("kept", 1)) == {"kept": 0}
    broker.env["ONCEFLOW_CRASH_AT"] = "topics.before-record"
    broker.restart()
    client = WireClient(broker.bootstrap)
    client.send(
        CreateTopicsRequest(
            topics=(creatable("crashy", 3), creatable("crashy2", 2)),
            timeout=datetime.timedelta(seconds=WAIT),
            validate_only=False,
        )
    )
    assert client.closed_by_peer(WAIT)  # the broker died before answering
    client.close()
    wait_exit(broker)
    assert any(name.startswith("crashy") for name in entries(data))  # files were made
    broker.env.pop("ONCEFLOW_CRASH_AT")
    broker.start()
    assert not any(name.startswith("crashy") for name in entries(data))
    assert {"keep-7", "kept-0"} <= entries(data)
    assert topic_names(broker.bootstrap) == {"kept"}
    assert create_topics(broker.bootstrap, creatable("crashy", 3)) == {"crashy": 0}
    assert {"crashy-0", "crashy-1", "crashy-2"} <= entries(data)


def test_kill_in_the_middle_of_a_delete_finishes_it_on_start(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = make_broker(data, env={"ONCEFLOW_CRASH_AT": "topics.after-delete-rename"})
    (data / "doomed-9").mkdir()  # not the topic's: must survive
    assert create_topics(broker.bootstrap, creatable("doomed", 2), creatable("stays", 1)) == {
        "doomed": 0,
        "stays": 0,
    }
    assert produce_errors(broker.bootstrap, "stays", {0: good_batch([b"v"])}) == {0: 0}
    client = WireClient(broker.bootstrap)
    client.send(
        DeleteTopicsRequest(
            topics=(DeleteTopicState(name="doomed", topic_id=None),),
            timeout=datetime.timedelta(seconds=WAIT),
        )
    )
    assert client.closed_by_peer(WAIT)
    client.close()
    wait_exit(broker)
    assert any(name.endswith("-delete") for name in entries(data))
    broker.env.pop("ONCEFLOW_CRASH_AT")
    broker.start()
    names = entries(data)
    assert not any(n.endswith("-delete") or n in ("doomed-0", "doomed-1") for n in names)
    assert {"doomed-9", "stays-0"} <= names
    assert topic_names(broker.bootstrap) == {"stays"}
    assert create_topics(broker.bootstrap, creatable("doomed", 1)) == {"doomed": 0}


def test_a_create_that_fails_half_way_leaves_no_directories(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    # The 50th partition this broker makes fails, as a full disk or a descriptor limit would.
    broker = make_broker(data, env={"ONCEFLOW_RAISE_AT": "topics.open-partition:50"})
    codes = create_topics(
        broker.bootstrap, creatable("first", 10), creatable("half", 100), creatable("last", 5)
    )
    assert codes == {"first": 0, "half": ErrorCode.kafka_storage_error, "last": 0}
    assert not any(name.startswith("half-") for name in entries(data))
    assert topic_names(broker.bootstrap) == {"first", "last"}
    assert_answers(broker)
    assert create_topics(broker.bootstrap, creatable("half", 100)) == {"half": 0}
    broker.restart()
    assert topic_names(broker.bootstrap) == {"first", "half", "last"}


def test_delete_removes_the_files_and_frees_the_name(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = make_broker(data)
    assert create_topics(broker.bootstrap, creatable("gone", 3)) == {"gone": 0}
    assert delete_topics(broker.bootstrap, "gone", "never") == {
        "gone": 0,
        "never": ErrorCode.unknown_topic_or_partition,
    }
    assert not any(n.startswith("gone") for n in entries(data))
    assert create_topics(broker.bootstrap, creatable("gone", 1)) == {"gone": 0}
    assert [len(t.partitions) for t in metadata(broker.bootstrap, ["gone"]).topics] == [1]


# -- liveness --------------------------------------------------------------------------------


def test_creating_500_topics_does_not_stall_other_clients(
    make_broker: MakeBroker, tmp_path: Path
) -> None:
    broker = make_broker(tmp_path / "data")
    assert create_topics(broker.bootstrap, creatable("busy", 1)) == {"busy": 0}
    worst = 0.0
    rounds = 0
    stop = threading.Event()
    failures: list[BaseException] = []

    def other_client() -> None:
        nonlocal worst, rounds
        try:
            while not stop.is_set():
                started = time.monotonic()
                assert metadata(broker.bootstrap, ["busy"]).topics[0].error_code == 0
                assert produce_errors(broker.bootstrap, "busy", {0: good_batch([b"x"])}) == {0: 0}
                worst = max(worst, time.monotonic() - started)
                rounds += 1
        except BaseException as e:  # reported by the test thread
            failures.append(e)

    thread = threading.Thread(target=other_client)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while rounds < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        names = [f"many-{uuid.uuid4().hex[:8]}-{i}" for i in range(500)]
        started = time.monotonic()
        codes = create_topics(broker.bootstrap, *(creatable(n) for n in names))
        took = time.monotonic() - started
        before = rounds
        deadline = time.monotonic() + WAIT
        while rounds < before + 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(WAIT)
    assert not failures, failures
    assert set(codes.values()) == {0}
    print(f"CreateTopics of 500 took {took:.2f} s; other client's worst round trip {worst:.3f} s")
    # A liveness bound, not a benchmark: 25 s before the change.
    assert worst < 1.0


# -- names and configs -----------------------------------------------------------------------


@pytest.fixture
def admin_broker(make_broker: MakeBroker, tmp_path: Path) -> EmbeddedBroker:
    return make_broker(tmp_path / "data")


def test_bad_names_get_invalid_topic_exception(admin_broker: EmbeddedBroker) -> None:
    address = admin_broker.bootstrap
    assert create_topics(address, creatable("a.b")) == {"a.b": 0}
    codes = create_topics(
        address,
        creatable("ok\n"),
        creatable("..\n"),
        creatable("a_b"),  # collides with a.b
        creatable("x.y"),
        creatable("x_y"),  # collides with x.y, made earlier in the same request
        creatable("ok"),
    )
    bad = ErrorCode.invalid_topic_exception
    assert codes == {"ok\n": bad, "..\n": bad, "a_b": bad, "x.y": 0, "x_y": bad, "ok": 0}
    assert topic_names(address) == {"a.b", "x.y", "ok"}
    assert [t.error_code for t in metadata(address, ["ok\n"]).topics] == [bad]
    assert_answers(admin_broker)


BAD_CONFIGS = [
    {"compression.type": "bogus"},
    {"compression.type": "GZIP"},  # Kafka's ValidString is case-sensitive
    {"min.insync.replicas": "abc"},
    {"min.insync.replicas": "0"},
    {"retention.ms": "1_000"},
    {"retention.ms": "\u0661\u0660\u0660\u0660"},  # Arabic-Indic digits
    {"retention.ms": "-2"},
    {"segment.bytes": "2147483648"},  # INT
    {"max.message.bytes": "1e6"},
    {"preallocate": "yes"},
    {"min.cleanable.dirty.ratio": "1.5"},
    {"min.cleanable.dirty.ratio": "NaN"},
    {"compression.gzip.level": "0"},
    {"compression.zstd.level": "23"},
    {"flush.messages": "0"},
    {"delete.retention.ms": "9223372036854775808"},  # past LONG
    {"leader.replication.throttled.replicas": "all"},
    {"no.such.config": "1"},
]

GOOD_CONFIGS = {
    "compression.type": "zstd",
    "min.insync.replicas": "1",
    "retention.ms": " 1000 ",
    "preallocate": "TRUE",
    "min.cleanable.dirty.ratio": "0.25",
    "compression.gzip.level": "-1",
    "compression.zstd.level": "-5",
    "leader.replication.throttled.replicas": "0:0,1:0",
    "delete.retention.ms": "9223372036854775807",
}


def test_bad_configs_get_invalid_config(admin_broker: EmbeddedBroker) -> None:
    topics = [creatable(f"bad-{i}", **configs) for i, configs in enumerate(BAD_CONFIGS)]
    codes = create_topics(admin_broker.bootstrap, *topics, creatable("good", **GOOD_CONFIGS))
    assert codes == {
        **{t.name: ErrorCode.invalid_config for t in topics},
        "good": 0,
    }, {t.name: (c, codes[t.name]) for t, c in zip(topics, BAD_CONFIGS, strict=True)}
    assert topic_names(admin_broker.bootstrap) == {"good"}
    assert not any(n.startswith("bad-") for n in entries(admin_broker.data_dir))
    assert_answers(admin_broker)
