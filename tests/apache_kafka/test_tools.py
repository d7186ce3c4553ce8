"""The `onceflow` tools give the same results against Apache Kafka 4.4.0 as against onceflow:
each scenario runs on both, and what must agree is compared (topics, partitions, the configs
both report, offsets, group states and lags, transaction states and producer ids, the errors
for the same mistakes), not what differs by design (broker and cluster ids, replication).

The plain commands run on the session's 3-node cluster and the session's onceflow broker;
`users` and `acls` on a 1-node cluster and an onceflow broker each with a SASL_PLAINTEXT
listener for SCRAM users and Kafka's StandardAuthorizer (PLAINTEXT, the tool's own listener,
is User:ANONYMOUS, a super user)."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from onceflow.apache_kafka import Distribution, KafkaCluster
from onceflow.apache_kafka.distribution import require_java
from onceflow.broker.embedded import EmbeddedBroker
from tests.cli.harness import Outcome, invoke
from tests.confluent import QUIET
from tests.security.brokers import authorizing, broker_with_users
from tests.waiting import wait_for

TIMEOUT_S = 60.0
# Topic configs the cluster sets broker-wide (exactly_once_settings): `topics describe` shows
# them as kafka-topics.sh does (every config not at its built-in default), onceflow has no
# such broker settings. Checked separately, left out of the comparison.
BROKER_WIDE = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class Target:
    """One side of a comparison: a broker (or cluster) the tools are pointed at."""

    name: str
    bootstrap: str
    sasl_bootstrap: str = ""
    # What the side has that the other lacks, replaced by a placeholder before comparing.
    addresses: tuple[str, ...] = ()
    # A cluster's nodes learn of a new topic after CreateTopics answers (Kafka's tools do
    # not wait either): the scenario waits before it asks another node about it.
    cluster: KafkaCluster | None = None

    def created(self, topic: str, partitions: int) -> None:
        if self.cluster is not None:
            self.cluster.wait_for_known_everywhere(topic, partitions, TIMEOUT_S)

    def run(self, *args: str, input: str | None = None) -> Outcome:
        return invoke(*args, "-b", self.bootstrap, input=input)

    def ok(self, *args: str, input: str | None = None) -> Outcome:
        outcome = self.run(*args, input=input)
        assert outcome.exit_code == 0, f"{self.name}: {args}: {outcome.stderr}"
        return outcome

    def error(self, *args: str, input: str | None = None) -> tuple[int, str]:
        """The exit code and the one error line of a failing command, made comparable."""
        outcome = self.run(*args, input=input)
        assert outcome.exit_code != 0, f"{self.name}: {args} succeeded: {outcome.stdout}"
        return outcome.exit_code, self.normal(outcome.assert_one_error_line())

    def normal(self, text: str) -> str:
        for address in sorted({*self.addresses, self.bootstrap, self.sasl_bootstrap}, key=len)[
            ::-1
        ]:
            if address:
                text = text.replace(address, "<address>")
        return text


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sides(kafka_cluster3: KafkaCluster, session_broker: EmbeddedBroker) -> list[Target]:
    cluster = kafka_cluster3
    nodes = tuple(n.address for n in cluster.nodes.values())
    return [
        Target("onceflow", session_broker.bootstrap),
        Target("Apache Kafka", cluster.bootstrap_servers, addresses=nodes, cluster=cluster),
    ]


def agree(results: dict[str, object]) -> None:
    """Every side's result equals the first's."""
    (first, expected), *others = results.items()
    for name, result in others:
        assert result == expected, f"{name} differs from {first}:\n{result}\n!=\n{expected}"


# --- topics, produce, consume -----------------------------------------------------------------


def describe(side: Target, topic: str) -> tuple[int, dict[str, str], list[list[str]]]:
    """`topics describe`: partition count, configs (broker-wide ones checked and left out), and
    per partition its earliest and latest offsets and error."""
    outcome = side.ok("topics", "describe", topic)
    header = next(line for line in outcome.lines if line.startswith("Topic: "))
    fields = dict(part.split(": ", 1) for part in header.split("\t"))
    configs = dict(item.split("=", 1) for item in fields["Configs"].split(",") if item)
    if side.name == "Apache Kafka":
        for key, value in BROKER_WIDE.items():
            assert configs.pop(key) == value, header
    rows = [[row[0], row[4], row[5], row[6]] for row in outcome.table_rows()]
    return int(fields["PartitionCount"]), configs, rows


def topics_scenario(side: Target, topic: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    seen["create"] = side.ok(
        "topics", "create", topic, "--partitions", "3",
        "--config", "retention.ms=86400000", "--config", "cleanup.policy=compact",
    ).stdout  # fmt: skip
    side.created(topic, 3)
    seen["listed"] = topic in side.ok("topics", "list").lines
    seen["described"] = describe(side, topic)
    seen["alter"] = side.ok(
        "topics", "alter", topic, "--add-config", "retention.ms=3600000",
        "--delete-config", "cleanup.policy",
    ).stdout  # fmt: skip
    # Keyed records: librdkafka's partitioner puts each key on the same partition on both.
    lines = "".join(f"k{i}:v{i}\n" for i in range(9))
    side.ok("produce", topic, "--property", "parse.key=true", "--property", "key.separator=:",
            input=lines)  # fmt: skip
    seen["after produce"] = describe(side, topic)
    consumed = side.ok(
        "consume", topic, "--from-beginning", "--max-messages", "9", "--print-key",
        "--property", "print.partition=true", "--property", "print.offset=true",
    )  # fmt: skip
    seen["consumed"] = sorted(consumed.lines)
    seen["one partition"] = side.ok(
        "consume", topic, "--partition", "1", "--from-beginning", "--timeout-ms", "2000"
    ).lines
    replication = side.error("topics", "create", f"{topic}-rf", "--replication-factor", "5")
    # The broker counts differ; Kafka 4.4 adds a clause on cordoned log directories (KIP-1066),
    # which onceflow has not.
    seen["too many replicas"] = re.sub(
        r"only \d+ broker\(s\) are registered.*\)", "N)", str(replication)
    )
    mistakes = {
        "exists": ["topics", "create", topic],
        "bad name": ["topics", "create", "bad/name"],
        "dot": ["topics", "create", ".."],
        "unknown config": ["topics", "create", f"{topic}-c1", "--config", "foo.bar=1"],
        "bad value": ["topics", "create", f"{topic}-c2", "--config", "retention.ms=abc"],
        "alter unknown": ["topics", "alter", topic, "--add-config", "foo=1"],
        "alter bad value": ["topics", "alter", topic, "--add-config", "retention.ms=x"],
        "alter missing": ["topics", "alter", "nope-topic", "--add-config", "retention.ms=1"],
        "describe missing": ["topics", "describe", "nope-topic"],
        "delete missing": ["topics", "delete", "nope-topic"],
        "produce missing": ["produce", "nope-topic"],
        "consume missing": ["consume", "nope-topic", "--timeout-ms", "100"],
        "consume partition": ["consume", topic, "--partition", "7", "--timeout-ms", "100"],
    }
    for what, args in mistakes.items():
        seen[what] = side.error(*args, input="x\n")
    seen["delete"] = side.ok("topics", "delete", topic).stdout
    # KRaft brokers learn of the deletion from the metadata log a moment later.
    wait_for(lambda: topic not in side.ok("topics", "list").lines, TIMEOUT_S, "the deletion")
    return seen


def test_topics_produce_and_consume_agree(sides: list[Target]) -> None:
    topic = unique("tools-topics")
    agree({side.name: topics_scenario(side, topic) for side in sides})


# --- groups -----------------------------------------------------------------------------------


def member_row(row: list[str]) -> list[str]:
    """A describe row with the member id (the client id and a random UUID, on both) reduced
    to its form."""
    return [re.sub(r"-[0-9a-f-]{36}$", "-<uuid>", cell) for cell in row]


def live_consumer(side: Target, group: str, topic: str) -> Consumer:
    """A classic-protocol member of `group`, once it has its assignment."""
    consumer = Consumer(
        {
            "bootstrap.servers": side.bootstrap,
            "group.id": group,
            "client.id": "tools-test",
            "enable.auto.commit": False,
            **QUIET,
        }
    )
    consumer.subscribe([topic])
    wait_for(consumer.assignment, TIMEOUT_S, "an assignment", poll=lambda: consumer.poll(0.1))
    return consumer


def groups_scenario(side: Target, topic: str, group: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    side.ok("topics", "create", topic, "--partitions", "1")
    side.created(topic, 1)
    side.ok("produce", topic, input="a\nb\nc\nd\ne\n")
    seen["consumed"] = side.ok(
        "consume", topic, "--group", group, "--from-beginning", "--max-messages", "3"
    ).lines
    seen["listed"] = [r for r in side.ok("groups", "list", "--state").table_rows() if r[0] == group]
    described = side.ok("groups", "describe", group)
    seen["described"] = (described.table_rows(), described.stderr)
    dry = side.ok("groups", "reset-offsets", group, "--all-topics", "--to-earliest")
    seen["dry run"] = (dry.table_rows(), dry.stderr)
    clamped = side.ok(
        "groups", "reset-offsets", group, "--topic", f"{topic}:0", "--to-offset", "9", "--execute"
    )
    seen["clamped"] = (clamped.table_rows(), clamped.stderr)
    seen["at the end"] = side.ok("groups", "describe", group).table_rows()
    side.ok("groups", "reset-offsets", group, "--topic", topic, "--to-offset", "1", "--execute")
    seen["re-read"] = side.ok("consume", topic, "--group", group, "--max-messages", "2").lines
    side.ok("groups", "reset-offsets", group, "--all-topics", "--to-latest", "--execute")
    seen["latest"] = side.ok("groups", "describe", group).table_rows()

    consumer = live_consumer(side, group, topic)
    try:
        seen["stable"] = [
            r for r in side.ok("groups", "list", "--state").table_rows() if r[0] == group
        ]
        seen["members"] = [member_row(r) for r in side.ok("groups", "describe", group).table_rows()]
        seen["reset while active"] = side.error(
            "groups", "reset-offsets", group, "--all-topics", "--to-earliest"
        )
        seen["delete while active"] = side.error("groups", "delete", group)
    finally:
        consumer.close()  # leaves the group: Empty again at once
    seen["delete"] = side.ok("groups", "delete", group).stdout
    seen["describe deleted"] = side.error("groups", "describe", group)
    seen["delete deleted"] = side.error("groups", "delete", group)
    seen["bad target"] = side.error("groups", "reset-offsets", group, "--all-topics")
    return seen


def test_groups_agree(sides: list[Target]) -> None:
    topic, group = unique("tools-groups"), unique("group")
    agree({side.name: groups_scenario(side, topic, group) for side in sides})


# --- transactions -----------------------------------------------------------------------------

# A transactional producer that writes to both partitions, says so and waits to be SIGKILLed:
# its transaction stays open for transaction.timeout.ms (10 minutes).
ZOMBIE = """
import sys, time
from confluent_kafka import Producer
bootstrap, transactional_id, topic = sys.argv[1:4]
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                     "transaction.timeout.ms": 600000, "log_level": 0})
producer.init_transactions(60)
producer.begin_transaction()
for partition in (0, 1):
    for i in range(3):
        producer.produce(topic, value=b"zombie-%d-%d" % (partition, i), partition=partition)
assert producer.flush(60) == 0
print("open", flush=True)
time.sleep(3600)
"""


def start_zombie(bootstrap: str, transactional_id: str, topic: str) -> subprocess.Popen[str]:
    zombie = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE, bootstrap, transactional_id, topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert zombie.stdout is not None
    assert zombie.stdout.readline().strip() == "open", "the producer did not open its transaction"
    return zombie


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def producers(side: Target, topic: str, partition: int) -> list[list[str]]:
    return side.ok(
        "transactions", "describe-producers", "--topic", topic, "--partition", str(partition)
    ).table_rows()


def transactions_scenario(side: Target, topic: str, txn: str) -> dict[str, object]:
    seen: dict[str, object] = {}
    side.ok("topics", "create", topic, "--partitions", "2")
    side.created(topic, 2)
    side.ok("produce", topic, "--property", "parse.key=true", input="k1\tbefore-1\nk2\tbefore-2\n")
    kill(start_zombie(side.bootstrap, txn, topic))
    side.ok("produce", topic, "--property", "parse.key=true", input="k1\tafter-1\nk2\tafter-2\n")

    (listed,) = [r for r in side.ok("transactions", "list").table_rows() if r[0] == txn]
    _id, _coordinator, producer_id, state = listed
    seen["listed"] = state
    seen["by state"] = txn in [
        r[0] for r in side.ok("transactions", "list", "--state", "ongoing").table_rows()
    ]
    seen["other state"] = txn in [
        r[0] for r in side.ok("transactions", "list", "--state", "CompleteCommit").table_rows()
    ]
    (described,) = side.ok("transactions", "describe", "--transactional-id", txn).table_rows()
    assert described[2] == producer_id, (described, listed)
    # id, epoch, state, timeout, partitions (not the coordinator, the start time, the duration)
    seen["described"] = [described[1], described[3], described[4], described[5], described[8]]
    starts = {}
    for partition in (0, 1):
        (mine,) = [r for r in producers(side, topic, partition) if r[0] == producer_id]
        starts[partition] = mine[5]
        seen[f"producer on {partition}"] = [mine[1], mine[2], mine[5]]  # epoch, coord epoch, start
    # Kafka's definition, which the tool follows: the coordinator still lists the partitions,
    # so it will abort the transaction itself when it times out; not hanging.
    hanging = side.ok("transactions", "find-hanging", "--topic", topic,
                      "--max-transaction-timeout-ms", "0")  # fmt: skip
    seen["find-hanging"] = (hanging.table_rows(), side.normal(hanging.stderr))
    seen["stuck"] = read_committed(side, topic)

    seen["wrong start"] = side.error(
        "transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", "99"
    )
    aborted = side.ok("transactions", "abort", "--topic", topic, "--partition", "0",
                      "--start-offset", starts[0])  # fmt: skip
    seen["abort on 0"] = aborted.stdout.replace(f"producer id {producer_id} ", "producer id P ")
    (after,) = [r for r in producers(side, topic, 0) if r[0] == producer_id]
    seen["open on 0 after"] = after[5]
    seen["partly"] = read_committed(side, topic)

    fenced = side.ok("transactions", "abort", "--transactional-id", txn).stdout
    seen["fenced"] = fenced.replace(f"producer id {producer_id} ", "producer id P ")
    (described,) = side.ok("transactions", "describe", "--transactional-id", txn).table_rows()
    seen["after fencing"] = [described[1], described[3], described[4], described[6]]
    seen["nothing open"] = side.error("transactions", "abort", "--transactional-id", txn)
    seen["unknown id"] = side.error("transactions", "describe", "--transactional-id", f"{txn}-x")
    seen["past it"] = read_committed(side, topic)
    return seen


def read_committed(side: Target, topic: str) -> list[str]:
    """What a read_committed console consumer reads from the beginning (until 3 s of quiet)."""
    return sorted(
        side.ok(
            "consume", topic, "--from-beginning", "--isolation-level", "read_committed",
            "--timeout-ms", "3000",
        ).lines
    )  # fmt: skip


def test_transactions_of_a_dead_producer_agree(sides: list[Target]) -> None:
    """A transactional producer SIGKILLed with its transaction open (classic protocol, as
    librdkafka speaks it): listed, described, aborted on one partition by its start offset,
    then fenced by its id; a read_committed consumer goes past it, on both."""
    topic, txn = unique("tools-txn"), unique("txn")
    results = {side.name: transactions_scenario(side, topic, txn) for side in sides}
    agree(results)
    seen = results["onceflow"]
    assert seen["listed"] == "Ongoing" and seen["described"][2] == "Ongoing"
    assert seen["stuck"] == ["before-1", "before-2"]
    assert seen["past it"] == ["after-1", "after-2", "before-1", "before-2"]


# A Java producer (Kafka's ProducerPerformance): it speaks transaction protocol v2 (KIP-890
# part 2: every transaction ends with an epoch bump) on Kafka 4.4 and on onceflow.
JAVA_TRANSACTIONS = "org.apache.kafka.tools.ProducerPerformance"


def java_transactions_scenario(
    side: Target, distribution: Distribution, topic: str, txn: str, tmp: Path
) -> dict[str, object]:
    seen: dict[str, object] = {}
    side.ok("topics", "create", topic, "--partitions", "1")
    side.created(topic, 1)
    log = tmp / f"{side.name.replace(' ', '-')}.log"
    with log.open("w") as out:
        producer = subprocess.Popen(
            [
                require_java(), "-Xmx256m", "-XX:TieredStopAtLevel=1",
                "-cp", distribution.classpath,
                JAVA_TRANSACTIONS, "--topic", topic, "--num-records", "100000000",
                "--record-size", "8", "--throughput", "50", "--transactional-id", txn,
                "--transaction-duration-ms", "1000", "--command-property",
                f"bootstrap.servers={side.bootstrap}", "transaction.timeout.ms=600000",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            # Two transactions or more committed (1 s each at 50 records/s), then killed
            # inside one: stopped, and killed once its transaction shows on the partition.
            wait_for(
                lambda: producer.poll() is None and read_committed_count(side, topic) >= 100,
                TIMEOUT_S * 2,
                lambda: f"committed records ({log.read_text()[-2000:]})",
            )
            wait_for(
                lambda: stopped_in_a_transaction(side, producer, topic, txn),
                TIMEOUT_S,
                "the producer stopped inside a transaction",
            )
        finally:
            kill(producer)
    side.ok("produce", topic, input="after\n")
    (described,) = side.ok("transactions", "describe", "--transactional-id", txn).table_rows()
    producer_id, epoch = described[2], int(described[3])
    seen["state"] = described[4]
    (mine,) = [r for r in producers(side, topic, 0) if r[0] == producer_id]
    assert int(mine[1]) == epoch, (mine, described)
    seen["open"] = mine[5] != "None"
    seen["after is hidden"] = "after" in side.ok(
        "consume", topic, "--from-beginning", "--isolation-level", "read_committed",
        "--timeout-ms", "2000",
    ).lines  # fmt: skip
    seen["abort on 0"] = side.ok(
        "transactions", "abort", "--topic", topic, "--partition", "0", "--start-offset", mine[5]
    ).stdout.replace(f"producer id {producer_id} (epoch {epoch})", "producer id P (epoch E)")
    seen["fenced"] = side.ok("transactions", "abort", "--transactional-id", txn).exit_code
    (after,) = side.ok("transactions", "describe", "--transactional-id", txn).table_rows()
    seen["after fencing"] = after[4]
    seen["epoch bumped by fencing"] = int(after[3]) > epoch
    seen["after is read"] = "after" in side.ok(
        "consume", topic, "--from-beginning", "--isolation-level", "read_committed",
        "--timeout-ms", "2000",
    ).lines  # fmt: skip
    seen["epoch"] = epoch
    return seen


def stopped_in_a_transaction(
    side: Target, producer: subprocess.Popen[str], topic: str, txn: str
) -> bool:
    """SIGSTOP the producer; True if its transaction is then open on the partition and not
    being committed, else it goes on (SIGCONT) and this is asked again."""
    producer.send_signal(signal.SIGSTOP)
    (described,) = side.ok("transactions", "describe", "--transactional-id", txn).table_rows()
    if described[4] == "Ongoing" and any(row[5] != "None" for row in producers(side, topic, 0)):
        return True
    producer.send_signal(signal.SIGCONT)
    return False


def read_committed_count(side: Target, topic: str) -> int:
    outcome = side.ok(
        "consume", topic, "--from-beginning", "--isolation-level", "read_committed",
        "--timeout-ms", "1000",
    )  # fmt: skip
    return len(outcome.lines)


def test_transactions_of_a_java_producer_agree(
    sides: list[Target], apache_kafka: Distribution, tmp_path: Path
) -> None:
    """Kafka's Java producer: transaction protocol v2 on Kafka 4.4 and on onceflow (its epoch
    grows with each transaction); the same commands find and abort its open transaction."""
    topic, txn = unique("tools-java-txn"), unique("java-txn")
    results = {
        side.name: java_transactions_scenario(side, apache_kafka, topic, txn, tmp_path)
        for side in sides
    }
    epochs = {name: seen.pop("epoch") for name, seen in results.items()}
    agree(results)
    assert results["onceflow"]["after is read"] and not results["onceflow"]["after is hidden"]
    # v1 would keep the epoch of InitProducerId across transactions; v2 bumps it at each end.
    assert epochs["onceflow"] >= 2, epochs
    assert epochs["Apache Kafka"] >= 2, epochs


# --- users and ACLs, on brokers with SASL/SCRAM and an authorizer -----------------------------


@pytest.fixture(scope="module")
def secured_sides(
    apache_kafka: Distribution, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Target]]:
    settings = {**authorizing("ANONYMOUS"), "sasl.enabled.mechanisms": ",".join(SCRAM)}
    cluster = KafkaCluster(
        tmp_path_factory.mktemp("kafka-sasl"),
        1,
        distribution=apache_kafka,
        settings=settings,
        sasl_mechanisms=SCRAM,
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(cluster)
        broker = stack.enter_context(
            broker_with_users(
                tmp_path_factory.mktemp("onceflow-sasl") / "data",
                {},
                listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                settings={**settings, "group.initial.rebalance.delay.ms": "0"},
                log_level="WARNING",
            )
        )
        yield [
            Target(
                "onceflow",
                broker.bootstrap_for("PLAINTEXT"),
                broker.bootstrap_for("SASL_PLAINTEXT"),
            ),
            Target("Apache Kafka", cluster.bootstrap_servers, cluster.sasl_bootstrap_servers),
        ]


def client_properties(path: Path, user: str, password: str, mechanism: str) -> Path:
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        f"sasl.mechanism={mechanism}\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";\n'
    )
    return path


def as_user(side: Target, properties: Path, *args: str) -> Outcome:
    return invoke(*args, "-b", side.sasl_bootstrap, "--command-config", str(properties))


def users_scenario(side: Target, user: str, tmp: Path) -> dict[str, object]:
    seen: dict[str, object] = {}
    password = tmp / "password"
    password.write_text("secret\n")
    pw = str(password)

    def mine() -> list[list[str]]:
        return [row for row in side.ok("users", "list").table_rows() if row[0] == user]

    seen["none"] = mine()
    seen["set 256"] = side.ok("users", "set", user, "--password-file", pw).stdout
    seen["set 512"] = side.ok("users", "set", user, "--password-file", pw, "--mechanism",
                              "SCRAM-SHA-512", "--iterations", "4096").stdout  # fmt: skip
    seen["both"] = mine()
    good = client_properties(tmp / f"{side.name}-good", user, "secret", "SCRAM-SHA-512")
    bad = client_properties(tmp / f"{side.name}-bad", user, "wrong", "SCRAM-SHA-512")
    seen["signs in"] = as_user(side, good, "topics", "list").exit_code
    wrong = as_user(side, bad, "topics", "list")
    seen["wrong password"] = (wrong.exit_code, side.normal(wrong.assert_one_error_line()))
    seen["few iterations"] = side.error("users", "set", user, "--password-file", pw,
                                        "--iterations", "100")  # fmt: skip
    seen["PLAIN"] = side.error("users", "set", user, "--password-file", pw, "--mechanism", "PLAIN")
    seen["delete 256"] = side.ok("users", "delete", user, "--mechanism", "SCRAM-SHA-256").stdout
    seen["one left"] = mine()
    seen["delete missing"] = side.error("users", "delete", f"{user}-nobody")
    seen["delete missing mechanism"] = side.error(
        "users", "delete", user, "--mechanism", "SCRAM-SHA-256"
    )
    seen["delete"] = side.ok("users", "delete", user).stdout
    seen["gone"] = mine()
    signed_out = as_user(side, good, "topics", "list")
    seen["signed out"] = (signed_out.exit_code, side.normal(signed_out.assert_one_error_line()))
    return seen


def test_users_agree(secured_sides: list[Target], tmp_path: Path) -> None:
    user = unique("user")
    agree({side.name: users_scenario(side, user, tmp_path) for side in secured_sides})


def acls_scenario(side: Target, user: str, topic: str, group: str, tmp: Path) -> dict[str, object]:
    seen: dict[str, object] = {}
    password = tmp / "password"
    password.write_text("secret\n")
    side.ok("users", "set", user, "--password-file", str(password), "--mechanism", "SCRAM-SHA-512")
    properties = client_properties(tmp / f"{side.name}-acl", user, "secret", "SCRAM-SHA-512")
    side.ok("topics", "create", topic, "--partitions", "1")
    side.ok("produce", topic, input="one\ntwo\n")
    principal = f"User:{user}"

    seen["unseen"] = topic in as_user(side, properties, "topics", "list").lines
    denied = as_user(side, properties, "consume", topic, "--group", group, "--max-messages", "1")
    seen["denied"] = (denied.exit_code, side.normal(denied.assert_one_error_line()))
    seen["add"] = side.ok(
        "acls", "add", "--topic", topic, "--group", group, "--allow-principal", principal,
        "--consumer",
    ).stdout  # fmt: skip
    seen["add again"] = side.ok(
        "acls", "add", "--topic", topic, "--allow-principal", principal, "--operation", "Read"
    ).stdout
    seen["add more"] = side.ok(
        "acls", "add", "--topic", topic[:8], "--resource-pattern-type", "prefixed",
        "--deny-principal", principal, "--deny-host", "10.0.0.1", "--operation", "Write",
    ).stdout  # fmt: skip
    seen["add producer"] = side.ok(
        "acls", "add", "--topic", topic, "--transactional-id", topic,
        "--allow-principal", principal, "--producer", "--idempotent",
    ).stdout  # fmt: skip
    seen["seen"] = topic in as_user(side, properties, "topics", "list").lines
    seen["consumed"] = as_user(
        side, properties, "consume", topic, "--group", group, "--from-beginning",
        "--max-messages", "2",
    ).lines  # fmt: skip
    seen["list topic"] = side.ok("acls", "list", "--topic", topic).stdout
    seen["list match"] = side.ok(
        "acls", "list", "--topic", topic, "--resource-pattern-type", "match",
        "--principal", principal,
    ).stdout  # fmt: skip
    seen["list mine"] = side.ok("acls", "list", "--principal", principal).stdout
    seen["bad principal"] = side.error("acls", "add", "--topic", topic, "--allow-principal", user)
    seen["bad operation"] = side.error(
        "acls", "add", "--topic", topic, "--allow-principal", principal, "--operation", "Fly"
    )
    seen["cluster read"] = side.error(
        "acls", "add", "--cluster", "--allow-principal", principal, "--operation", "Read"
    )
    seen["remove"] = side.ok(
        "acls", "remove", "--topic", topic, "--group", group, "--transactional-id", topic,
        "--force",
    ).stdout  # fmt: skip
    seen["remove prefixed"] = side.ok(
        "acls", "remove", "--topic", topic[:8], "--resource-pattern-type", "prefixed", "--force"
    ).stdout
    emptied = side.ok("acls", "list", "--principal", principal)
    seen["emptied"] = (emptied.stdout, emptied.stderr)
    seen["unseen again"] = topic in as_user(side, properties, "topics", "list").lines
    return seen


def test_acls_agree(secured_sides: list[Target], tmp_path: Path) -> None:
    user, topic, group = unique("acl-user"), unique("tools-acls"), unique("acl-group")
    results = {
        side.name: acls_scenario(side, user, topic, group, tmp_path) for side in secured_sides
    }
    agree(results)
    seen = results["onceflow"]
    assert (seen["unseen"], seen["seen"], seen["unseen again"]) == (False, True, False)
    assert seen["consumed"] == ["one", "two"]
