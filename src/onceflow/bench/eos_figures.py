"""`onceflow bench-eos`'s figures: each kind's rounds, the transactions' latencies, and
Apache Kafka's published targets for the cost of exactly-once, read as met / not met."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from onceflow.bench.eos_producer import TxnProducerReport
from onceflow.bench.stats import BrokerCost, CostSummary, Latency, Phase, medians, rate_ratio

PRODUCERS = ("plain", "idempotent", "transactional")
ISOLATIONS = ("read_uncommitted", "read_committed")


@dataclass
class Transactions:
    """What the transactional producers did, summed over their processes."""

    committed: int = 0
    aborted: int = 0
    committed_records: int = 0
    aborted_records: int = 0
    commit: Latency | None = None
    abort: Latency | None = None
    flush: Latency | None = None
    first_ack: Latency | None = None
    duration: Latency | None = None

    @classmethod
    def of(cls, reports: Sequence[TxnProducerReport]) -> Transactions:
        def merged(name: str) -> list[float]:
            return [ms for report in reports for ms in getattr(report, name)]

        return cls(
            committed=sum(len(r.commit_ms) for r in reports),
            aborted=sum(len(r.abort_ms) for r in reports),
            committed_records=sum(r.committed_records for r in reports),
            aborted_records=sum(r.aborted_records for r in reports),
            commit=Latency.of(merged("commit_ms")),
            abort=Latency.of(merged("abort_ms")),
            flush=Latency.of(merged("flush_ms")),
            first_ack=Latency.of(merged("first_ack_ms")),
            duration=Latency.of(merged("transaction_ms")),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "committed": self.committed,
            "aborted": self.aborted,
            "committed_records": self.committed_records,
            "aborted_records": self.aborted_records,
            "commit_latency_ms": self.commit.as_json() if self.commit else None,
            "abort_latency_ms": self.abort.as_json() if self.abort else None,
            "flush_before_end_ms": self.flush.as_json() if self.flush else None,
            "begin_to_first_ack_ms": self.first_ack.as_json() if self.first_ack else None,
            "transaction_duration_ms": self.duration.as_json() if self.duration else None,
        }


@dataclass
class EosMeasurement:
    """Every round of one target; the tables show the median round of each kind."""

    target: str
    produce_rounds: dict[str, list[Phase]] = field(default_factory=dict)
    consume_rounds: dict[str, list[Phase]] = field(default_factory=dict)
    txn_reports: list[TxnProducerReport] = field(default_factory=list)
    # What each round of each kind cost the broker (CPU: a started broker's).
    produce_costs: dict[str, list[BrokerCost]] = field(default_factory=dict)
    consume_costs: dict[str, list[BrokerCost]] = field(default_factory=dict)
    # The topic the consumers read: (records in it, records in committed transactions).
    consumed_topic: tuple[int, int] | None = None
    error: str | None = None

    @property
    def produce(self) -> dict[str, Phase]:
        return medians(self.produce_rounds)

    @property
    def consume(self) -> dict[str, Phase]:
        return medians(self.consume_rounds)

    def costs(self) -> dict[str, CostSummary]:
        """Each kind's costs over its rounds, keyed "<producer> produce"/"<isolation> consume"."""
        found = {f"{k} produce": CostSummary.of(v) for k, v in self.produce_costs.items()}
        found.update({f"{k} consume": CostSummary.of(v) for k, v in self.consume_costs.items()})
        return found

    @property
    def transactions(self) -> Transactions | None:
        """Transactions of every round together (so the latencies have more samples)."""
        return Transactions.of(self.txn_reports) if self.txn_reports else None


@dataclass(frozen=True)
class KafkaTarget:
    """One of Apache Kafka's published figures for the cost of exactly-once."""

    key: str
    figure: str
    target: str
    measure: Callable[[EosMeasurement], float | None]
    met: Callable[[float], bool]
    unit: str = "x"

    def text(self, value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:.2f}x" if self.unit == "x" else f"{value:.1f} ms"


def _produce_ratio(top: str, bottom: str) -> Callable[[EosMeasurement], float | None]:
    def measure(m: EosMeasurement) -> float | None:
        return rate_ratio(m.produce.get(top), m.produce.get(bottom))

    return measure


def _consume_ratio(m: EosMeasurement) -> float | None:
    # Both read the same log; read_committed hands out fewer records (the aborted ones are
    # dropped), so the fair ratio is time to read it all: read_uncommitted's over committed's.
    committed, uncommitted = m.consume.get("read_committed"), m.consume.get("read_uncommitted")
    if committed is None or uncommitted is None or committed.seconds <= 0:
        return None
    return uncommitted.seconds / committed.seconds


def _commit_p99(m: EosMeasurement) -> float | None:
    if m.transactions is None or m.transactions.commit is None:
        return None
    return m.transactions.commit.p99


KAFKA_TARGETS = (
    KafkaTarget(
        "transactional_vs_idempotent",
        "transactional / idempotent producer",
        ">= 0.95x (within 5%)",
        _produce_ratio("transactional", "idempotent"),
        lambda v: v >= 0.95,
    ),
    KafkaTarget(
        "idempotent_vs_plain",
        "idempotent / plain producer",
        ">= 0.90x (within 10%)",
        _produce_ratio("idempotent", "plain"),
        lambda v: v >= 0.90,
    ),
    KafkaTarget(
        "read_committed_vs_read_uncommitted",
        "read_committed / read_uncommitted consumer",
        ">= 0.95x (within 5%)",
        _consume_ratio,
        lambda v: v >= 0.95,
    ),
    KafkaTarget(
        "commit_p99_ms",
        "commit_transaction() p99",
        "< 10 ms (fsync on)",
        _commit_p99,
        lambda v: v < 10.0,
        unit="ms",
    ),
)


def target_results(m: EosMeasurement) -> list[tuple[KafkaTarget, float | None, bool | None]]:
    """Each Kafka target with the measured figure and whether it is met (None: no figure)."""
    rows: list[tuple[KafkaTarget, float | None, bool | None]] = []
    for target in KAFKA_TARGETS:
        value = target.measure(m)
        rows.append((target, value, None if value is None else target.met(value)))
    return rows
