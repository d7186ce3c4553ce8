"""The seeded scheduler: one random choice per step among everything that could happen next.

Everything that happens comes from one `random.Random(seed)`: which message is delivered,
lost or duplicated, when an fsync round starts and ends, when marker jobs and timers run, when
the clock jumps, when a client crashes or is paused (and comes back as a zombie), and when the
broker crashes. So a seed replays exactly: `python -m onceflow.simulation --seed N --trace`.

A run has two phases: faults and clients at random for `steps` steps, then quiescence (no
more faults; clients finish their transactions, abandoned ones time out) and the final checks.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.coordinator.runtime import replay_offsets_batch
from onceflow.log.aborted_index import AbortedTxn, aborted_entry
from onceflow.log.producer_state import ProducerStateManager
from onceflow.records.control import ControlType, parse_control_record
from onceflow.simulation.broker import (
    BrokerSettings,
    CoreState,
    SimBroker,
    Storage,
)
from onceflow.simulation.checker import Checker, InvariantViolation
from onceflow.simulation.clients import (
    INPUT_PARTITION,
    ClientContext,
    ClientState,
    InstanceState,
    Program,
    idempotent_program,
    transactional_program,
)
from onceflow.simulation.messages import Answer, Produce, TopicPartition, TxnRecord, describe
from onceflow.txn.transaction_state import TransactionState

DEFAULT_STEPS = 300
QUIESCE_STEPS = 4000
TXN_TIMEOUT_MS = 60_000


Action = tuple[float, str, object, Callable[[], None]]


@dataclass
class SimulationConfig:
    """What the seed does not choose. The defaults are what CI runs."""

    steps: int = DEFAULT_STEPS
    faults: bool = True


@dataclass
class SimulationResult:
    seed: int
    steps: int
    stats: dict[str, int]


class SimulationFailure(AssertionError):
    """A seed broke an invariant (or a core raised); carries the replay command and trace."""

    def __init__(
        self, seed: int, config: SimulationConfig, step: int, error: BaseException, trace: list[str]
    ) -> None:
        self.seed = seed
        self.step = step
        self.error = error
        self.trace = trace
        self.replay = replay_command(seed, config)
        super().__init__(
            f"seed {seed} failed at step {step}: {type(error).__name__}: {error}\n"
            f"replay: {self.replay}"
        )


def replay_command(seed: int, config: SimulationConfig) -> str:
    extra = "" if config.steps == DEFAULT_STEPS else f" --steps {config.steps}"
    extra += "" if config.faults else " --no-faults"
    return f"python -m onceflow.simulation --seed {seed}{extra} --trace"


@dataclass
class Message:
    to_broker: bool
    instance: Instance
    correlation: int
    payload: object
    incarnation: int


@dataclass
class Instance:
    """One client process: a program, and the request it waits on."""

    state: ClientState
    program: Program
    number: int
    handle: InstanceState = field(default_factory=InstanceState)
    to_send: object | None = None  # yielded by the program, not sent yet
    waiting: object | None = None  # sent, not answered
    correlation: int = -1
    alive: bool = True

    @property
    def label(self) -> str:
        return f"{self.state.name}#{self.number}{'(zombie)' if self.handle.zombie else ''}"


@dataclass
class Faults:
    """Per-seed fault rates (all zero while quiescing)."""

    lose_request: float
    lose_response: float
    duplicate_request: float
    crash: float
    clock_jump: float
    client_crash: float
    client_pause: float


class Simulation:
    def __init__(
        self, seed: int, config: SimulationConfig | None = None, *, trace: bool = False
    ) -> None:
        self.seed = seed
        self.config = config or SimulationConfig()
        self.rng = random.Random(seed)
        rng = self.rng
        self.clock = ManualClock(1_700_000_000_000)
        self.checker = Checker()
        self.checker.tracing = trace
        self.tracing = trace
        topics = rng.randint(1, 2)
        partitions = [(f"t{t}", p) for t in range(topics) for p in range(rng.randint(1, 2))]
        self.partitions: list[TopicPartition] = partitions
        self.root = Path(tempfile.mkdtemp(prefix=f"onceflow-sim-{seed}-", dir=_tmp_root()))
        self.storage = Storage.create(self.root, partitions, segment_batches=rng.randint(2, 12))
        self.settings = BrokerSettings(
            transaction_max_timeout_ms=900_000,
            transactional_id_expiration_ms=rng.choice([300_000, 604_800_000]),
        )
        self.ctx = ClientContext(
            rng=rng,
            checker=self.checker,
            partitions=partitions,
            txn_timeout_ms=TXN_TIMEOUT_MS,
            abort_ratio=rng.choice([0.0, 0.2, 0.4]),
        )
        on = self.config.faults
        self.faults = Faults(
            lose_request=rng.choice([0.0, 0.05, 0.15]) if on else 0.0,
            lose_response=rng.choice([0.0, 0.05, 0.15]) if on else 0.0,
            duplicate_request=rng.choice([0.0, 0.05, 0.15]) if on else 0.0,
            crash=rng.choice([0.0, 0.01, 0.03]) if on else 0.0,
            clock_jump=rng.choice([0.0, 0.01, 0.03]) if on else 0.0,
            client_crash=rng.choice([0.0, 0.01, 0.02]) if on else 0.0,
            client_pause=rng.choice([0.0, 0.01, 0.02]) if on else 0.0,
        )
        self.clients: list[ClientState] = []
        # Which transactional clients speak transactions version 2 (KIP-890 part 2): drawn
        # apart, so that each seed's workload and faults are those it had before.
        versions = random.Random(f"transaction.version {seed}")
        for i in range(rng.randint(1, 3)):
            group = f"g{i}" if rng.random() < 0.5 else None
            version = 2 if versions.random() < 0.5 else 0
            self.clients.append(ClientState(f"tx{i}", f"tx{i}", group, transaction_version=version))
        for i in range(rng.randint(0, 2)):
            self.clients.append(ClientState(f"idem{i}", None))
        self.instances: list[Instance] = []
        self.down: list[ClientState] = []
        self.numbers: dict[str, int] = {}
        self.network: list[Message] = []
        self.round: list[tuple[object, int]] | None = None
        self.correlation = 0
        self.step_no = 0
        self.stats: dict[str, int] = {}
        self.storage_logs = self.storage.partitions
        self.checker.rebuild_audits(self.storage_logs)
        self.broker = SimBroker(self.storage, self.clock, self.settings, self.checker)
        self.broker.start()
        for client in self.clients:
            self._start_instance(client)
        self.trace(
            f"seed {seed}: partitions {partitions}, clients "
            f"{[(c.name, c.group) for c in self.clients]}, faults {self.faults}"
        )

    # -- running ---------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        try:
            for _ in range(self.config.steps):
                self._step(quiescing=False)
            self._quiesce()
            return SimulationResult(self.seed, self.step_no, dict(sorted(self.stats.items())))
        except (InvariantViolation, Exception) as error:
            raise SimulationFailure(
                self.seed, self.config, self.step_no, error, self.checker.lines
            ) from error
        finally:
            self.broker.abandon()
            shutil.rmtree(self.root, ignore_errors=True)

    def trace(self, line: str) -> None:
        self.checker.trace(line)

    def _count(self, name: str) -> None:
        self.stats[name] = self.stats.get(name, 0) + 1

    def _step(self, *, quiescing: bool) -> None:
        self.step_no += 1
        self.clock.advance(self.rng.randint(0, 20))
        actions = self._actions(quiescing)
        total = sum([action[0] for action in actions])
        pick = self.rng.random() * total
        chosen = actions[-1]
        for candidate in actions:
            pick -= candidate[0]
            if pick < 0:
                chosen = candidate
                break
        _, kind, subject, action = chosen
        if self.tracing:
            label = subject.label if isinstance(subject, Instance) else subject or ""
            if self.tracing:
                self.trace(f"step {self.step_no} t={self.clock() % 1_000_000}: {kind} {label}")
        self.stats[kind] = self.stats.get(kind, 0) + 1
        action()
        self._check_step()

    def _actions(self, quiescing: bool) -> list[Action]:
        actions: list[Action] = []
        held = self._held()
        in_network = {id(m.instance) for m in self.network}
        for inst in self.instances:
            if inst.to_send is not None:
                actions.append((3.0, "send", inst, lambda i=inst: self._send(i)))
            if inst.waiting is not None:
                lost = not held and id(inst) not in in_network
                weight = 4.0 if lost else (0.0 if quiescing else 0.2)
                if weight:
                    actions.append((weight, "timeout", inst, lambda i=inst: self._timeout(i)))
        deliver = self._deliver
        for message in self.network:
            kind = "deliver-request" if message.to_broker else "deliver-response"
            actions.append((3.0, kind, message.instance, lambda m=message: deliver(m)))
        if self.round is None and any(log.dirty for log in self.storage.all_logs):
            actions.append((2.0, "fsync-start", None, self._fsync_start))
        if self.round is not None:
            actions.append((2.0, "fsync-finish", None, self._fsync_finish))
        for index, (label, _) in enumerate(self.broker.tasks):
            actions.append((2.0, "task", label, lambda i=index: self._run_task(i)))
        for timer in self.broker.due_timers() if self.broker.timers else ():
            actions.append((2.0, "timer-due", timer.label, lambda t=timer: self.broker.fire(t)))
        actions.append((0.3, "timer", None, self._timer))
        actions.append((1.0, "poll", None, self._poll))
        actions.append((0.3, "offsets", None, self._offsets))
        f = self.faults
        if not quiescing:
            if f.crash:
                actions.append((f.crash * 10, "crash", None, self._crash))
            if f.clock_jump:
                actions.append((f.clock_jump * 10, "clock-jump", None, self._clock_jump))
            live = (
                [i for i in self.instances if not i.handle.zombie]
                if f.client_crash or f.client_pause
                else []
            )
            if f.client_crash and live:
                crash = lambda: self._client_crash(live)  # noqa: E731
                actions.append((f.client_crash * 10, "client-crash", None, crash))
            for client in self.down:
                restart = lambda c=client: self._restart(c)  # noqa: E731
                actions.append((0.3, "client-restart", client.name, restart))
            if f.client_pause and live:
                pause = lambda: self._client_pause(live)  # noqa: E731
                actions.append((f.client_pause * 10, "client-pause", None, pause))
        elif not self.instances and self._open_transactions():
            # only abandoned transactions are left: let them time out
            actions.append((1.0, "clock-jump", None, self._clock_jump))
        return actions

    def _held(self) -> bool:
        # the broker may hold the request (waiting for durability or in a task)
        broker = self.broker
        return bool(broker.waiters or broker.tasks or broker.timers) or self.round is not None

    # -- clients and the network -----------------------------------------------------------

    def _start_instance(self, client: ClientState) -> None:
        number = self.numbers.get(client.name, 0) + 1
        self.numbers[client.name] = number
        inst = Instance(client, iter(()), number)  # type: ignore[arg-type]
        if client.transactional_id is not None:
            program = transactional_program(self.ctx, client, self.clock, inst.handle)
        else:
            program = idempotent_program(self.ctx, client, self.clock, inst.handle)
        inst.program = program
        self.instances.append(inst)
        self._advance(inst, None)

    def _advance(self, inst: Instance, answer: Answer | None) -> None:
        try:
            request = next(inst.program) if answer is None else inst.program.send(answer)
        except StopIteration:
            self._end_instance(inst, "finished")
            return
        inst.to_send = request
        inst.waiting = None

    def _end_instance(self, inst: Instance, why: str) -> None:
        inst.alive = False
        inst.to_send = inst.waiting = None
        self.instances.remove(inst)
        if self.tracing:
            self.trace(f"  {inst.label} {why}")
        if inst.handle.zombie or self.ctx.stopping:
            return
        if why == "crashed" and self.rng.random() < 0.5:
            # down for a while (or for good): its open transaction must time out
            self.down.append(inst.state)
        else:
            self._start_instance(inst.state)

    def _send(self, inst: Instance) -> None:
        request, inst.to_send = inst.to_send, None
        inst.waiting = request
        self._transmit(inst, request)

    def _transmit(self, inst: Instance, request: object) -> None:
        self.correlation += 1
        inst.correlation = self.correlation
        if self.tracing:
            self.trace(f"  {inst.label} -> {describe(request)}")
        self.network.append(Message(True, inst, self.correlation, request, self.broker.incarnation))

    def _timeout(self, inst: Instance) -> None:
        """The client gives up waiting, closes the connection and sends the same request again.

        Requests the broker has not read yet die with the connection, except Produce copies,
        which may still arrive late (sequence numbers make them harmless). A stale EndTxn
        arriving in the next transaction would commit it early: transaction version 1 has no
        defence against that (KIP-890 part 2 has), so the simulation does not deliver one.
        """
        self.network = [
            m
            for m in self.network
            if not (m.to_broker and m.instance is inst and not isinstance(m.payload, Produce))
        ]
        self._transmit(inst, inst.waiting)

    def _deliver(self, message: Message) -> None:
        self.network.remove(message)
        if message.to_broker:
            if self.rng.random() < self.faults.lose_request:
                if self.tracing:
                    self.trace("  request lost")
                self._count("lost-request")
                return
            self._handle(message)
            if self.rng.random() < self.faults.duplicate_request:
                self._count("duplicated-request")
                if isinstance(message.payload, Produce) and self.rng.random() < 0.5:
                    # A copy that arrives late, e.g. on a connection the client gave up on;
                    # sequence numbers must make it harmless. Its answer goes nowhere.
                    if self.tracing:
                        self.trace("  request duplicated, the copy arrives later")
                    self.network.append(
                        Message(True, message.instance, -1, message.payload, message.incarnation)
                    )
                else:
                    if self.tracing:
                        self.trace("  request delivered twice")
                    self._handle(message)
            return
        inst = message.instance
        if self.rng.random() < self.faults.lose_response:
            if self.tracing:
                self.trace("  response lost")
            self._count("lost-response")
            return
        if not inst.alive or inst.correlation != message.correlation or inst.waiting is None:
            if self.tracing:
                self.trace("  response ignored (stale)")
            return
        answer = message.payload
        assert isinstance(answer, Answer)
        if self.tracing:
            value = "" if answer.value is None else answer.value
            self.trace(f"  {inst.label} <- {answer.error.name} {value}")
        self._advance(inst, answer)

    def _handle(self, message: Message) -> None:
        if message.incarnation != self.broker.incarnation:
            return  # the connection died with the broker
        if self.tracing:
            self.trace(
                f"  broker handles {describe(message.payload)} from {message.instance.label}"
            )
        broker = self.broker
        request = message.payload

        def reply(answer: Answer) -> None:
            self.checker.answered(request, answer)
            if broker is not self.broker:
                return
            if self.tracing:
                self.trace(f"  broker answers {message.instance.label}: {answer.error.name}")
            self.network.append(
                Message(False, message.instance, message.correlation, answer, broker.incarnation)
            )

        broker.handle(request, reply)

    def _client_crash(self, live: list[Instance]) -> None:
        inst = self.rng.choice(live)
        txn = inst.handle.current_txn
        if txn is not None and txn.outcome == "open":
            txn.outcome = "unknown" if txn.commit_sent else "aborted"
        self._end_instance(inst, "crashed")

    def _restart(self, client: ClientState) -> None:
        self.down.remove(client)
        self._start_instance(client)

    def _client_pause(self, live: list[Instance]) -> None:
        """The instance stalls and is taken for dead: a new one starts; the old one wakes up
        later as a zombie that finishes what it was doing."""
        inst = self.rng.choice(live)
        inst.handle.zombie = True
        if self.tracing:
            self.trace(f"  {inst.state.name}#{inst.number} paused, now a zombie")
        self._start_instance(inst.state)

    # -- the broker's background work ------------------------------------------------------

    def _fsync_start(self) -> None:
        self.round = [(log, log.prepare_flush()) for log in self.storage.all_logs if log.dirty]

    def _fsync_finish(self) -> None:
        assert self.round is not None
        for log, offset in self.round:
            log.complete_flush(offset)  # type: ignore[attr-defined]
        self.round = None
        self.broker.release_waiters()

    def _run_task(self, index: int) -> None:
        _, task = self.broker.tasks.pop(index)
        task()

    def _timer(self) -> None:
        count = self.broker.expire()
        if count:
            self._count("timeout-abort")

    def _clock_jump(self) -> None:
        jump = TXN_TIMEOUT_MS + self.rng.randint(1_000, 60_000)
        self.clock.advance(jump)
        if self.tracing:
            self.trace(f"  clock +{jump} ms")

    # -- reads -----------------------------------------------------------------------------

    def _poll(self) -> None:
        tp = self.rng.choice(self.partitions)
        count = self.checker.poll(self.broker.partitions, tp, self.rng.choice([1, 200, 100_000]))
        if self.tracing:
            self.trace(f"  read_committed {tp}: {count} records")

    def _offsets(self) -> None:
        for client in self.clients:
            if client.group is None:
                continue
            self._check_group(client.group)

    def _check_group(self, group: str) -> int | None:
        broker = self.broker
        plain = broker.fetch_offsets(group, [INPUT_PARTITION], False).get(INPUT_PARTITION)
        stable = broker.fetch_offsets(group, [INPUT_PARTITION], True).get(INPUT_PARTITION)
        committed = None if plain is None or plain.offset < 0 else plain.offset
        stable_offset = None
        if stable is not None and stable.error == ErrorCode.none:
            stable_offset = stable.offset
        self.checker.check_offsets(
            group, committed, stable_offset if committed is not None else None
        )
        pending = self._surely_pending(group)
        if pending is not None and (
            stable is None or stable.error != ErrorCode.unstable_offset_commit
        ):
            raise InvariantViolation(
                f"group {group}: offsets of the ongoing transaction #{pending.txn_no} of "
                f"{pending.transactional_id} are pending, yet require_stable answered {stable}"
            )
        return committed

    def _surely_pending(self, group: str) -> TxnRecord | None:
        """The transaction whose offsets must be pending now: its TxnOffsetCommit succeeded, no
        EndTxn was sent, and the coordinator still has it Ongoing at the same epoch (no timeout
        or fencing aborted it)."""
        owners = [t for (g, _), t in self.checker.offset_owner.items() if g == group]
        if not owners:
            return None
        txn = owners[-1]
        if not txn.offsets_pending or txn.end_sent:
            return None
        coordinator = self.broker.coordinator
        meta = coordinator.get(txn.transactional_id)
        if (
            meta is None
            or meta.state is not TransactionState.ONGOING
            or (meta.producer_id, meta.producer_epoch) != (txn.producer_id, txn.producer_epoch)
            or coordinator.has_pending(txn.transactional_id)
        ):
            return None
        return txn

    # -- checks ----------------------------------------------------------------------------

    def _check_step(self) -> None:
        self.checker.check_partitions(self.broker.partitions)
        self.checker.check_coordinator(
            {
                txn_id: (meta.producer_id, meta.producer_epoch)
                for txn_id, meta in self.broker.coordinator.transactions().items()
            }
        )

    def _open_transactions(self) -> list[str]:
        return [
            txn_id
            for txn_id, meta in self.broker.coordinator.transactions().items()
            if meta.state
            not in (
                TransactionState.EMPTY,
                TransactionState.COMPLETE_COMMIT,
                TransactionState.COMPLETE_ABORT,
                TransactionState.DEAD,
            )
        ]

    # -- crash -----------------------------------------------------------------------------

    def _crash(self) -> None:
        old = self.broker
        live = old.snapshot_state()
        ends = {tp: log.log_end_offset for tp, log in self.storage.partitions.items()}
        live_partitions = {
            tp: (p.producers, p.aborted.entries()) for tp, p in old.partitions.items()
        }
        old.abandon()
        self.network.clear()
        self.round = None
        kept: dict[str, int] = {}
        for name, log in self.storage.logs():
            choices = log.kept_offsets()
            mode = self.rng.random()
            keep = (
                choices[0]
                if mode < 0.4
                else choices[-1]
                if mode < 0.7
                else self.rng.choice(choices)
            )
            lost = log.log_end_offset - keep
            log.crash(keep)
            kept[name] = keep
            if lost and self.tracing:
                self.trace(f"  {name}: kept up to {keep}, lost {lost} offsets")
        for log in self.storage.partitions.values():
            if self.rng.random() < 0.2:
                _tear_newest_snapshot(log.directory, self.rng)
        new = SimBroker(
            self.storage, self.clock, self.settings, self.checker, incarnation=old.incarnation + 1
        )
        self.broker = new
        new.start()
        if self.tracing:
            self.trace(
                f"  broker restarted (incarnation {new.incarnation}), in doubt: {len(new.tasks)}"
            )
        self._compare_coordinators(live, new)
        for tp, partition in new.partitions.items():
            producers, aborted = live_partitions[tp]
            log = self.storage.partitions[tp]
            if log.log_end_offset == ends[tp]:
                _compare_producers(
                    tp,
                    "live",
                    producers,
                    aborted,
                    partition.producers,
                    partition.aborted.entries(),
                    log.log_end_offset,
                )
            fresh, fresh_aborted = _replay_from_scratch(log, self.clock)
            _compare_producers(
                tp,
                "a full replay",
                fresh,
                fresh_aborted,
                partition.producers,
                partition.aborted.entries(),
                log.log_end_offset,
            )
        self.checker.rebuild_audits(self.storage.partitions)
        self.checker.check_durable_reads(new.partitions)

    def _compare_coordinators(self, live: CoreState, new: SimBroker) -> None:
        """The rebuilt coordinators equal the live ones advanced by the surviving records they
        had not applied yet (appended, not yet durable, kept by the crash)."""
        expected = live.coordinator
        for stored in self.storage.txn_log.iter_stored(0):
            if stored.header.base_offset not in live.applied_txn:
                for record in stored.decoded.records:
                    expected.replay(record.key or b"", record.value)
        if expected.transactions() != new.coordinator.transactions():
            raise InvariantViolation(
                "transaction coordinator rebuilt after a crash differs from the durable state: "
                f"{_diff(expected.transactions(), new.coordinator.transactions())}"
            )
        groups = live.groups
        for stored in self.storage.offsets_log.iter_stored(0):
            if stored.header.base_offset not in live.applied_offsets:
                replay_offsets_batch(groups, stored.decoded)
        group_ids = sorted({c.group for c in self.clients if c.group is not None})
        producer_ids = sorted(self.checker.issued)
        for group in group_ids:
            want, got = groups.offsets.committed(group), new.groups.offsets.committed(group)
            if want != got:
                raise InvariantViolation(
                    f"group {group}: offsets rebuilt as {got}, durable state {want}"
                )
            if groups.offsets.pending_partitions(group) != new.groups.offsets.pending_partitions(
                group
            ):
                raise InvariantViolation(f"group {group}: pending offsets differ after a crash")
        for pid in producer_ids:
            if groups.offsets.pending_for_producer(pid) != new.groups.offsets.pending_for_producer(
                pid
            ):
                raise InvariantViolation(f"producer {pid}: pending offsets differ after a crash")

    # -- the end ---------------------------------------------------------------------------

    def _quiesce(self) -> None:
        self.ctx.stopping = True
        self.faults = Faults(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        if self.tracing:
            self.trace("quiescing")
        for _ in range(QUIESCE_STEPS):
            if self._quiet():
                break
            self._step(quiescing=True)
        else:
            raise InvariantViolation(f"no quiescence after {QUIESCE_STEPS} steps: {self._busy()}")
        for tp in self.partitions:
            while self.checker.poll(self.broker.partitions, tp, 100_000):
                pass
        self.checker.check_final(self.broker.partitions)
        for client in self.clients:
            if client.group is not None:
                committed = self._check_group(client.group)
                self.checker.check_final_offsets(client.group, committed)
        for txn in self.checker.txns:
            self._count(f"txn-{txn.outcome}")
            if txn.transaction_version >= 2 and txn.outcome == "committed":
                self._count("txn-committed-v2")  # transactions version 2 (KIP-890 part 2)

    def _quiet(self) -> bool:
        return not self._busy()

    def _busy(self) -> str:
        busy = []
        if any(i.alive for i in self.instances):
            busy.append(f"clients {[i.label for i in self.instances]}")
        if self.network:
            busy.append(f"{len(self.network)} messages")
        broker = self.broker
        if broker.tasks or broker.waiters or broker.timers:
            tasks = [label for label, _ in broker.tasks] + [t.label for t in broker.timers]
            busy.append(f"broker work {tasks} {[w.label for w in broker.waiters]}")
        if self.round is not None or any(log.dirty for log in self.storage.all_logs):
            busy.append("unflushed logs")
        if self._open_transactions():
            busy.append(f"open transactions {self._open_transactions()}")
        return "; ".join(busy)


def run_seed(
    seed: int, config: SimulationConfig | None = None, *, trace: bool = False
) -> SimulationResult:
    """Run one seed; raises SimulationFailure (with the replay command) on any violation."""
    return Simulation(seed, config, trace=trace).run()


def _tmp_root() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


def _tear_newest_snapshot(directory: Path, rng: random.Random) -> None:
    """Snapshots are written without fsync: power loss may leave the newest one torn."""
    snapshots = sorted(directory.glob("*.snapshot"))
    if snapshots:
        path = snapshots[-1]
        data = path.read_bytes()
        path.write_bytes(data[: rng.randint(0, max(len(data) - 1, 0))])


def _replay_from_scratch(
    log: object, clock: ManualClock
) -> tuple[ProducerStateManager, list[AbortedTxn]]:
    manager = ProducerStateManager(clock)
    aborted: list[AbortedTxn] = []
    for header in log.iter_batch_headers(0):  # type: ignore[attr-defined]
        control = None
        if header.is_control:
            stored = next(log.iter_stored(header.base_offset))  # type: ignore[attr-defined]
            kind, coordinator_epoch = parse_control_record(stored.decoded.records[0])
            control = (kind == ControlType.COMMIT, coordinator_epoch)
        completed = manager.replay(header, control)
        entry = None if completed is None else aborted_entry(completed)
        if entry is not None:
            aborted.append(entry)
    manager.update_map_end_offset(log.log_end_offset)  # type: ignore[attr-defined]
    return manager, aborted


def _compare_producers(
    tp: TopicPartition,
    what: str,
    want: ProducerStateManager,
    want_aborted: list[AbortedTxn],
    got: ProducerStateManager,
    got_aborted: list[AbortedTxn],
    end: int,
) -> None:
    checks = [
        ("producers", want.producers(), got.producers()),
        ("open transactions", want.open_transactions(), got.open_transactions()),
        ("aborted transactions", want_aborted, got_aborted),
        ("last stable offset", want.last_stable_offset(end), got.last_stable_offset(end)),
    ]
    for name, a, b in checks:
        if a != b:
            raise InvariantViolation(
                f"{tp}: {name} rebuilt after a crash differ from {what}: {a} != {b}"
            )


def _diff(a: dict[str, object], b: dict[str, object]) -> str:
    keys = sorted(set(a) | set(b))
    return "; ".join(f"{k}: {a.get(k)} != {b.get(k)}" for k in keys if a.get(k) != b.get(k))
