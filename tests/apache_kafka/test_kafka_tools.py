"""Apache Kafka 4.4's own command-line tools against onceflow, each with its usual commands and
its output read back: kafka-topics, kafka-console-producer/-consumer, kafka-consumer-groups,
kafka-transactions, kafka-configs (topic and broker), kafka-get-offsets, kafka-delete-records,
kafka-producer-perf-test, kafka-verifiable-producer/-consumer. Each tool runs through its main
class from the fetched jars, one JVM per command, against the session's broker (unique topics).
SCRAM users and ACLs (a broker with security on): test_kafka_tools_security.py."""

from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from onceflow.apache_kafka import Distribution
from onceflow.broker.embedded import EmbeddedBroker
from tests.apache_kafka.kafka_tools import (
    CONFIGS,
    CONSOLE_CONSUMER,
    CONSOLE_PRODUCER,
    CONSUMER_GROUPS,
    DELETE_RECORDS,
    GET_OFFSETS,
    PRODUCER_PERF_TEST,
    TOPICS,
    TRANSACTIONS,
    VERIFIABLE_CONSUMER,
    VERIFIABLE_PRODUCER,
    KafkaTools,
    json_events,
    space_table,
    tab_table,
    write_log4j2,
)
from tests.confluent import QUIET, create_topic, send, transactional_producer
from tests.waiting import wait_for


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def log4j2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_log4j2(tmp_path_factory.mktemp("kafka-tools"))


@pytest.fixture
def tools(apache_kafka: Distribution, session_broker: EmbeddedBroker, log4j2: Path) -> KafkaTools:
    return KafkaTools(apache_kafka, session_broker.bootstrap, log4j2)


def offsets_of(tools: KafkaTools, topic: str, *time: str) -> dict[int, int]:
    """kafka-get-offsets: {partition: offset} ('TOPIC:PARTITION:OFFSET' lines)."""
    ran = tools.ok(GET_OFFSETS, "--bootstrap-server", tools.bootstrap, "--topic", topic, *time)
    found = {}
    for line in ran.lines():
        name, partition, offset = line.rsplit(":", 2)
        assert name == topic, line
        found[int(partition)] = int(offset)
    return found


# -- kafka-topics ----------------------------------------------------------------------------


def topic_description(tools: KafkaTools, topic: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """kafka-topics --describe: the topic line's fields, then one dict per partition line."""
    ran = tools.ok(TOPICS, "--bootstrap-server", tools.bootstrap, "--describe", "--topic", topic)
    head, *partitions = ran.lines()

    def fields(line: str) -> dict[str, str]:
        cells = [cell.strip() for cell in line.strip().split("\t")]
        return dict(cell.split(": ", 1) for cell in cells if ": " in cell)

    return fields(head), [fields(line) for line in partitions]


def test_kafka_topics_create_describe_alter_delete(tools: KafkaTools) -> None:
    topic = unique("topics")
    b = ("--bootstrap-server", tools.bootstrap)
    created = tools.ok(
        TOPICS, *b, "--create", "--topic", topic, "--partitions", "3",
        "--replication-factor", "1",
        "--config", "retention.ms=3600000", "--config", "cleanup.policy=compact",
    )  # fmt: skip
    assert created.lines() == [f"Created topic {topic}."]

    head, partitions = topic_description(tools, topic)
    assert head["Topic"] == topic
    assert (head["PartitionCount"], head["ReplicationFactor"]) == ("3", "1")
    assert head["Configs"] == "cleanup.policy=compact,retention.ms=3600000"
    assert [p["Partition"] for p in partitions] == ["0", "1", "2"]
    assert {(p["Leader"], p["Replicas"], p["Isr"]) for p in partitions} == {("0", "0", "0")}

    again = tools.run(TOPICS, *b, "--create", "--topic", topic, "--partitions", "1")
    assert again.returncode == 1
    assert f"Topic '{topic}' already exists." in again.stdout + again.stderr

    tools.ok(TOPICS, *b, "--alter", "--topic", topic, "--partitions", "5")
    head, partitions = topic_description(tools, topic)
    assert head["PartitionCount"] == "5"
    assert [p["Partition"] for p in partitions] == ["0", "1", "2", "3", "4"]
    fewer = tools.run(TOPICS, *b, "--alter", "--topic", topic, "--partitions", "2")
    assert fewer.returncode == 1
    assert "InvalidPartitionsException: Topic currently has 5 partitions" in fewer.stderr

    assert topic in tools.ok(TOPICS, *b, "--list").lines()
    tools.ok(TOPICS, *b, "--delete", "--topic", topic)
    wait_for(
        lambda: topic not in tools.ok(TOPICS, *b, "--list").lines(),
        what=f"{topic} gone from kafka-topics --list",
    )


# -- kafka-console-producer / kafka-console-consumer ----------------------------------------


def test_console_producer_and_consumer_keys_headers_read_committed(
    tools: KafkaTools, session_broker: EmbeddedBroker
) -> None:
    topic = unique("console")
    create_topic(session_broker.bootstrap, topic)
    b = ("--bootstrap-server", tools.bootstrap)
    tools.ok(
        CONSOLE_PRODUCER, *b, "--topic", topic,
        "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
        stdin="k1:v1\nk2:v2\n",
    )  # fmt: skip
    tools.ok(
        CONSOLE_PRODUCER, *b, "--topic", topic,
        "--reader-property", "parse.key=true", "--reader-property", "parse.headers=true",
        stdin="h1:a,h2:b\tk3\tv3\n",
    )  # fmt: skip
    # A transaction aborted, then one committed, from a transactional producer.
    producer = transactional_producer(session_broker.bootstrap, unique("console-txn"))
    producer.begin_transaction()
    send(producer, [(topic, 0, b"aborted-1"), (topic, 0, b"aborted-2")])
    producer.abort_transaction(30)
    producer.begin_transaction()
    send(producer, [(topic, 0, b"committed")])
    producer.commit_transaction(30)

    def consume(isolation: str, count: int) -> list[str]:
        ran = tools.ok(
            CONSOLE_CONSUMER, *b, "--topic", topic, "--from-beginning",
            "--max-messages", str(count), "--timeout-ms", "60000",
            "--isolation-level", isolation,
            "--formatter-property", "print.key=true",
            "--formatter-property", "print.headers=true",
            "--formatter-property", "print.offset=true",
        )  # fmt: skip
        assert f"Processed a total of {count} messages" in ran.stderr
        return ran.lines()

    # Offsets 3-4 the aborted records, 5 the abort marker, 6 the committed one, 7 its marker.
    committed = [
        "Offset:0\tNO_HEADERS\tk1\tv1",
        "Offset:1\tNO_HEADERS\tk2\tv2",
        "Offset:2\th1:a,h2:b\tk3\tv3",
        "Offset:6\tNO_HEADERS\tnull\tcommitted",
    ]
    assert consume("read_committed", 4) == committed
    uncommitted = consume("read_uncommitted", 6)
    assert uncommitted == [
        *committed[:3],
        "Offset:3\tNO_HEADERS\tnull\taborted-1",
        "Offset:4\tNO_HEADERS\tnull\taborted-2",
        committed[3],
    ]


# -- kafka-consumer-groups -------------------------------------------------------------------


def test_kafka_consumer_groups_describe_lag_reset_delete(
    tools: KafkaTools, session_broker: EmbeddedBroker
) -> None:
    topic, group = unique("groups"), unique("group")
    create_topic(session_broker.bootstrap, topic, partitions=2)
    send(
        Producer({"bootstrap.servers": session_broker.bootstrap, **QUIET}),
        [(topic, p, f"{p}-{i}".encode()) for p in (0, 1) for i in range(5)],
    )
    b = ("--bootstrap-server", tools.bootstrap)
    consumer = Consumer(
        {
            "bootstrap.servers": session_broker.bootstrap,
            "group.id": group,
            "client.id": "tools-test-client",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **QUIET,
        }
    )
    try:
        consumer.subscribe([topic])
        wait_for(
            lambda: len(consumer.assignment()) == 2,
            60,
            "assignment",
            poll=lambda: consumer.poll(0.2),
        )
        consumer.commit(
            offsets=[TopicPartition(topic, 0, 2), TopicPartition(topic, 1, 5)], asynchronous=False
        )
        described = space_table(
            tools.ok(CONSUMER_GROUPS, *b, "--describe", "--group", group).stdout, "GROUP"
        )
        assert [
            (r["PARTITION"], r["CURRENT-OFFSET"], r["LOG-END-OFFSET"], r["LAG"], r["CLIENT-ID"])
            for r in sorted(described, key=lambda r: r["PARTITION"])
        ] == [("0", "2", "5", "3", "tools-test-client"), ("1", "5", "5", "0", "tools-test-client")]
        assert {r["CONSUMER-ID"] for r in described} == {consumer.memberid()}

        (state,) = space_table(
            tools.ok(CONSUMER_GROUPS, *b, "--describe", "--group", group, "--state").stdout, "GROUP"
        )
        # COORDINATOR (ID) is two cells: "host:port", "(0)".
        assert (state["STATE"], state["#MEMBERS"], state["ASSIGNMENT-STRATEGY"]) == (
            "Stable", "1", "range",
        )  # fmt: skip
        (member,) = space_table(
            tools.ok(CONSUMER_GROUPS, *b, "--describe", "--group", group, "--members").stdout,
            "GROUP",
        )
        assert (member["CLIENT-ID"], member["#PARTITIONS"]) == ("tools-test-client", "2")

        busy = tools.run(
            CONSUMER_GROUPS, *b, "--group", group, "--reset-offsets", "--to-earliest",
            "--topic", topic, "--execute",
        )  # fmt: skip
        assert "is inactive, but the current state is Stable" in busy.stdout + busy.stderr, busy
    finally:
        consumer.close()

    listed = tools.ok(CONSUMER_GROUPS, *b, "--list").lines()
    assert group in listed
    reset = tools.ok(
        CONSUMER_GROUPS, *b, "--group", group, "--reset-offsets", "--to-earliest",
        "--topic", topic, "--execute",
    )  # fmt: skip
    assert sorted(
        (r["PARTITION"], r["NEW-OFFSET"]) for r in space_table(reset.stdout, "GROUP")
    ) == [("0", "0"), ("1", "0")]
    dry = tools.ok(
        CONSUMER_GROUPS, *b, "--group", group, "--reset-offsets", "--to-offset", "4",
        "--topic", f"{topic}:1", "--dry-run",
    )  # fmt: skip
    assert [(r["PARTITION"], r["NEW-OFFSET"]) for r in space_table(dry.stdout, "GROUP")] == [
        ("1", "4")
    ]
    shifted = tools.ok(
        CONSUMER_GROUPS, *b, "--group", group, "--reset-offsets", "--shift-by", "3",
        "--topic", f"{topic}:0", "--execute",
    )  # fmt: skip
    assert [(r["PARTITION"], r["NEW-OFFSET"]) for r in space_table(shifted.stdout, "GROUP")] == [
        ("0", "3")
    ]
    described = tools.ok(CONSUMER_GROUPS, *b, "--describe", "--group", group)
    assert f"Consumer group '{group}' has no active members." in described.stdout + described.stderr
    lags = {
        r["PARTITION"]: (r["CURRENT-OFFSET"], r["LAG"], r["CONSUMER-ID"])
        for r in space_table(described.stdout, "GROUP")
    }
    assert lags == {"0": ("3", "2", "-"), "1": ("0", "5", "-")}

    deleted = tools.ok(CONSUMER_GROUPS, *b, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in deleted.stdout
    assert group not in tools.ok(CONSUMER_GROUPS, *b, "--list").lines()
    missing = tools.run(CONSUMER_GROUPS, *b, "--describe", "--group", group)
    assert f"Consumer group '{group}' does not exist." in missing.stdout + missing.stderr


# -- kafka-transactions ----------------------------------------------------------------------


def test_kafka_transactions_list_describe_describe_producers(
    tools: KafkaTools, session_broker: EmbeddedBroker
) -> None:
    topic, txn_id = unique("txns"), unique("txn")
    create_topic(session_broker.bootstrap, topic)
    b = ("--bootstrap-server", tools.bootstrap)
    send(Producer({"bootstrap.servers": session_broker.bootstrap, **QUIET}), [(topic, 0, b"plain")])
    producer = transactional_producer(
        session_broker.bootstrap, txn_id, **{"transaction.timeout.ms": 600_000}
    )
    producer.begin_transaction()
    send(producer, [(topic, 0, b"open-1"), (topic, 0, b"open-2")])
    listed = {r["TransactionalId"]: r for r in tab_table(tools.ok(TRANSACTIONS, *b, "list").stdout)}
    assert listed[txn_id]["TransactionState"] == "Ongoing"
    producer_id = listed[txn_id]["ProducerId"]
    # --duration-filter (ListTransactions v1): running longer than 0 ms yes, 1 hour no.
    longer = tab_table(tools.ok(TRANSACTIONS, *b, "list", "--duration-filter", "0").stdout)
    assert txn_id in {r["TransactionalId"] for r in longer}
    hour = tab_table(tools.ok(TRANSACTIONS, *b, "list", "--duration-filter", "3600000").stdout)
    assert txn_id not in {r["TransactionalId"] for r in hour}

    (described,) = tab_table(
        tools.ok(TRANSACTIONS, *b, "describe", "--transactional-id", txn_id).stdout
    )
    assert (
        described["ProducerId"],
        described["ProducerEpoch"],
        described["TransactionState"],
        described["TransactionTimeoutMs"],
        described["TopicPartitions"],
    ) == (producer_id, "0", "Ongoing", "600000", f"{topic}-0")

    producers = tab_table(
        tools.ok(
            TRANSACTIONS, *b, "describe-producers", "--topic", topic, "--partition", "0"
        ).stdout
    )
    mine = {r["ProducerId"]: r for r in producers}[producer_id]
    started = mine["CurrentTransactionStartOffset"]
    assert (mine["ProducerEpoch"], mine["LastSequence"], started) == ("0", "1", "1")
    # Open under its coordinator: not hanging, whatever the age asked for.
    assert tab_table(
        tools.ok(
            TRANSACTIONS, *b, "find-hanging", "--broker-id", "0",
            "--max-transaction-timeout", "0",
        ).stdout
    ) == []  # fmt: skip
    tools.ok(TRANSACTIONS, *b, "forceTerminateTransaction", "--transactionalId", txn_id)
    (after,) = tab_table(
        tools.ok(TRANSACTIONS, *b, "describe", "--transactional-id", txn_id).stdout
    )
    # Aborted and fenced (KIP-939's forceTerminateTransaction: InitProducerId for its id).
    assert (after["TransactionState"], after["TopicPartitions"]) == ("Empty", "")
    assert int(after["ProducerEpoch"]) > 0
    with pytest.raises(KafkaException):
        producer.commit_transaction(30)
    producers = tab_table(
        tools.ok(
            TRANSACTIONS, *b, "describe-producers", "--topic", topic, "--partition", "0"
        ).stdout
    )
    assert {r["ProducerId"]: r for r in producers}[producer_id][
        "CurrentTransactionStartOffset"
    ] == "None"
    unknown = tools.run(TRANSACTIONS, *b, "describe", "--transactional-id", unique("nobody"))
    assert unknown.returncode == 1
    assert "failed because the ID could not be found" in unknown.stderr, unknown


def test_kafka_transactions_find_hanging_and_abort(
    apache_kafka: Distribution,
    log4j2: Path,
    make_broker: Callable[..., EmbeddedBroker],
    tmp_path: Path,
) -> None:
    """A transaction its coordinator has forgotten (its log deleted) hangs on its partition:
    find-hanging names it, abort --start-offset writes the ABORT marker Kafka's way
    (WriteTxnMarkers), and read_committed readers get past it."""
    data_dir = tmp_path / "hanging"
    broker = make_broker(data_dir)
    tools = KafkaTools(apache_kafka, broker.bootstrap, log4j2)
    topic = unique("hanging")
    create_topic(broker.bootstrap, topic)
    zombie = transactional_producer(broker.bootstrap, unique("zombie"))
    zombie.begin_transaction()
    send(zombie, [(topic, 0, b"h-0"), (topic, 0, b"h-1")])
    broker.kill()
    shutil.rmtree(data_dir / "__transaction_state-0")
    broker.start()
    send(
        Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, **QUIET}),
        [(topic, 0, b"plain")],
    )
    b = ("--bootstrap-server", tools.bootstrap)
    # Too young under the default 15 minutes; hanging when any age counts.
    young = tools.ok(TRANSACTIONS, *b, "find-hanging", "--broker-id", "0")
    assert tab_table(young.stdout) == []
    (hanging,) = tab_table(
        tools.ok(
            TRANSACTIONS, *b, "find-hanging", "--topic", topic, "--max-transaction-timeout", "0"
        ).stdout
    )
    assert (hanging["Topic"], hanging["Partition"], hanging["StartOffset"]) == (topic, "0", "0")
    assert offsets_of(tools, topic, "--time", "-1") == {0: 3}

    tools.ok(TRANSACTIONS, *b, "abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    assert (
        tab_table(
            tools.ok(
                TRANSACTIONS, *b, "find-hanging", "--topic", topic, "--max-transaction-timeout", "0"
            ).stdout
        )
        == []
    )
    committed = tools.ok(
        CONSOLE_CONSUMER, *b, "--topic", topic, "--from-beginning", "--max-messages", "1",
        "--timeout-ms", "60000", "--isolation-level", "read_committed",
    )  # fmt: skip
    assert committed.lines() == ["plain"]
    assert offsets_of(tools, topic, "--time", "-1") == {0: 4}  # the marker


# -- kafka-get-offsets and kafka-delete-records ---------------------------------------------


def test_kafka_get_offsets_and_delete_records(
    tools: KafkaTools, session_broker: EmbeddedBroker, tmp_path: Path
) -> None:
    topic = unique("offsets")
    create_topic(session_broker.bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": session_broker.bootstrap, **QUIET})
    for i in range(10):
        producer.produce(topic, value=b"v%d" % i, partition=0, timestamp=1_000_000 + i * 1000)
    producer.produce(topic, value=b"one", partition=1, timestamp=5_000_000)
    assert producer.flush(30) == 0
    assert offsets_of(tools, topic) == {0: 10, 1: 1}
    assert offsets_of(tools, topic, "--time", "-2") == {0: 0, 1: 0}
    assert offsets_of(tools, topic, "--time", "-3") == {0: 9, 1: 0}  # max timestamp
    assert offsets_of(tools, topic, "--time", "1004500") == {0: 5, 1: 0}
    ran = tools.ok(
        GET_OFFSETS, "--bootstrap-server", tools.bootstrap, "--topic-partitions", f"{topic}:1"
    )
    assert ran.lines() == [f"{topic}:1:1"]

    plan = tmp_path / "delete.json"
    plan.write_text(deletion_plan(topic, 0, 4))
    b = ("--bootstrap-server", tools.bootstrap)
    deleted = tools.ok(DELETE_RECORDS, *b, "--offset-json-file", str(plan))
    assert f"partition: {topic}-0\tlow_watermark: 4" in deleted.stdout, deleted.stdout
    assert offsets_of(tools, topic, "--time", "-2") == {0: 4, 1: 0}
    assert offsets_of(tools, topic, "--time", "-1") == {0: 10, 1: 1}
    consumed = tools.ok(
        CONSOLE_CONSUMER, *b, "--topic", topic, "--partition", "0", "--from-beginning",
        "--max-messages", "6", "--timeout-ms", "60000",
        "--formatter-property", "print.offset=true",
    )  # fmt: skip
    assert consumed.lines() == [f"Offset:{i}\tv{i}" for i in range(4, 10)]

    # Past the high watermark: Kafka's OFFSET_OUT_OF_RANGE for that partition.
    plan.write_text(deletion_plan(topic, 1, 7))
    beyond = tools.run(DELETE_RECORDS, *b, "--offset-json-file", str(plan))
    assert (
        f"partition: {topic}-1\terror: org.apache.kafka.common.errors.OffsetOutOfRangeException"
        in (beyond.stdout)
    ), beyond.stdout
    assert offsets_of(tools, topic, "--time", "-2") == {0: 4, 1: 0}


def deletion_plan(topic: str, partition: int, offset: int) -> str:
    """kafka-delete-records' --offset-json-file."""
    return json.dumps(
        {"version": 1, "partitions": [{"topic": topic, "partition": partition, "offset": offset}]}
    )


# -- kafka-configs (topics and brokers) ------------------------------------------------------


def config_lines(text: str) -> dict[str, str]:
    """kafka-configs --describe: '  name=value sensitive=... synonyms={...}' lines."""
    out = {}
    for line in text.splitlines():
        if line.startswith("  ") and "=" in line:
            name, _, rest = line.strip().partition("=")
            out[name] = rest
    return out


def test_kafka_configs_topic_and_broker(tools: KafkaTools, session_broker: EmbeddedBroker) -> None:
    topic = unique("configs")
    create_topic(session_broker.bootstrap, topic)
    b = ("--bootstrap-server", tools.bootstrap)
    entity = ("--entity-type", "topics", "--entity-name", topic)
    assert config_lines(tools.ok(CONFIGS, *b, *entity, "--describe").stdout) == {}
    altered = tools.ok(
        CONFIGS,
        *b,
        *entity,
        "--alter",
        "--add-config",
        "retention.ms=86400000,max.message.bytes=2000000",
    )
    assert f"Completed updating config for topic {topic}." in altered.stdout
    dynamic = config_lines(tools.ok(CONFIGS, *b, *entity, "--describe").stdout)
    assert set(dynamic) == {"retention.ms", "max.message.bytes"}
    # Synonyms: the topic's value, then the broker setting it defaults to (Kafka's format).
    assert dynamic["retention.ms"] == (
        "86400000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=86400000, "
        "DEFAULT_CONFIG:log.retention.ms=604800000}"
    )
    assert dynamic["max.message.bytes"] == (
        "2000000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:max.message.bytes=2000000, "
        "DEFAULT_CONFIG:message.max.bytes=1048588}"
    )

    tools.ok(CONFIGS, *b, *entity, "--alter", "--delete-config", "retention.ms")
    every = config_lines(tools.ok(CONFIGS, *b, *entity, "--describe", "--all").stdout)
    assert every["retention.ms"].startswith("604800000 ")  # back to the default
    assert every["max.message.bytes"].startswith("2000000 ")
    assert every["cleanup.policy"] == (
        "delete sensitive=false synonyms={DEFAULT_CONFIG:log.cleanup.policy=delete}"
    )

    bad = tools.run(CONFIGS, *b, *entity, "--alter", "--add-config", "retention.ms=soon")
    assert bad.returncode == 1
    assert "InvalidConfigurationException" in bad.stdout + bad.stderr, bad

    broker = ("--entity-type", "brokers", "--entity-name", "0")
    assert config_lines(tools.ok(CONFIGS, *b, *broker, "--describe").stdout) == {}
    static = config_lines(tools.ok(CONFIGS, *b, *broker, "--describe", "--all").stdout)
    assert static["group.initial.rebalance.delay.ms"].startswith("0 sensitive=false")
    assert static["auto.create.topics.enable"].startswith("true ")
    # No dynamic broker configs: settings are read at start (InvalidRequestException).
    dynamic_broker = tools.run(
        CONFIGS, *b, *broker, "--alter", "--add-config", "log.cleaner.threads=2"
    )
    assert dynamic_broker.returncode == 1
    assert "Cannot update these configs dynamically: log.cleaner.threads" in (
        dynamic_broker.stdout + dynamic_broker.stderr
    )


# -- kafka-producer-perf-test, kafka-verifiable-producer / -consumer -----------------------


def test_kafka_producer_perf_test(tools: KafkaTools, session_broker: EmbeddedBroker) -> None:
    topic = unique("perf")
    create_topic(session_broker.bootstrap, topic, partitions=2)
    plain = tools.ok(
        PRODUCER_PERF_TEST, "--topic", topic, "--num-records", "5000", "--record-size", "100",
        "--throughput", "-1",
        "--command-property", f"bootstrap.servers={tools.bootstrap}", "acks=all",
    )  # fmt: skip
    assert plain.lines()[-1].startswith("5000 records sent, "), plain.stdout
    transactional = tools.ok(
        PRODUCER_PERF_TEST, "--topic", topic, "--num-records", "2000", "--record-size", "100",
        "--throughput", "-1", "--transactional-id", unique("perf-txn"),
        "--transaction-duration-ms", "100",
        "--command-property", f"bootstrap.servers={tools.bootstrap}",
    )  # fmt: skip
    assert transactional.lines()[-1].startswith("2000 records sent, "), transactional.stdout
    assert sum(offsets_of(tools, topic).values()) >= 7000


def test_kafka_verifiable_producer_and_consumer(
    tools: KafkaTools, session_broker: EmbeddedBroker
) -> None:
    topic, group = unique("verifiable"), unique("verifiable")
    create_topic(session_broker.bootstrap, topic, partitions=3)
    count = 300
    produced = json_events(
        tools.ok(
            VERIFIABLE_PRODUCER, "--bootstrap-server", tools.bootstrap, "--topic", topic,
            "--max-messages", str(count), "--acks", "-1",
        ).stdout
    )  # fmt: skip
    acked = [e for e in produced if e["name"] == "producer_send_success"]
    assert [e for e in produced if e["name"] == "producer_send_error"] == []
    assert sorted(int(e["value"]) for e in acked) == list(range(count))
    assert len({(e["partition"], e["offset"]) for e in acked}) == count
    (summary,) = [e for e in produced if e["name"] == "tool_data"]
    assert (summary["sent"], summary["acked"]) == (count, count)

    consumed = json_events(
        tools.ok(
            VERIFIABLE_CONSUMER, "--bootstrap-server", tools.bootstrap, "--topic", topic,
            "--group-id", group, "--max-messages", str(count), "--reset-policy", "earliest",
        ).stdout
    )  # fmt: skip
    records = [
        (r["partition"], offset)
        for e in consumed
        if e["name"] == "records_consumed"
        for r in e["partitions"]
        for offset in range(r["minOffset"], r["maxOffset"] + 1)
    ]
    assert Counter(records) == Counter((e["partition"], e["offset"]) for e in acked)
    commits = [e for e in consumed if e["name"] == "offsets_committed"]
    assert commits and all(e["success"] for e in commits), commits
    last = {o["partition"]: o["offset"] for e in commits for o in e["offsets"]}
    ends = Counter(e["partition"] for e in acked)
    assert last == {p: ends[p] for p in ends}
