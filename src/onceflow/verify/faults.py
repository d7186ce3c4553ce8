"""The fault injector (Jepsen's nemesis): faults chosen by flag, mixed at random with a seed.

One fault at a time: a calm spell, then a fault held for a while, then healed, each recorded
in the history (process `nemesis`: invoke when injected, ok when healed, fail if it could not
be injected). Kinds:
- kill: SIGKILL of the broker, restarted (same port, same data) after a moment; with the
  database workload's own PostgreSQL server (verify --postgres), of it or the broker;
- pause: SIGSTOP of the broker or of one client process, SIGCONT after long enough to trip
  request and transaction timeouts;
- crash-client: SIGKILL of a client process, mid-transaction or mid-poll; a new instance
  starts (same transactional.id, so it fences the old one);
- partition: one client's or every client's connections cut, black-holed or delayed by the
  proxy; on a managed Apache Kafka cluster, half the time instead every client's connections
  to one node (the node still reaching the others);
- disk: the broker's data directory's filesystem filled up, then freed (a small tmpfs where
  the harness may mount one, else a full disk simulated in the broker's log layer);
- kill-mirror (verify --mirror): SIGKILL of the mirror's driver (its process group: JVM and
  Python workers), restarted after a moment; with a mirror, kill picks the source or the
  target broker at random;
- lagging-failover (verify --apache-kafka, 2+ nodes): its followers' fetches from the leader
  of a workload partition cut until it is alone in its ISR, held so while the workload
  writes, then the leader SIGKILLed and restarted once another leader is elected or a
  deadline passed (lagging_failover.py): what loses acknowledged writes under unsafe settings.

The broker faults (kill, disk, pausing the broker) need a broker the run manages: the embedded
one, or (verify --apache-kafka) an Apache Kafka cluster, where kill and pause strike one node at
a time, chosen as the leader of a workload partition, the coordinator of a transactional id or
of the group, or at random (kafka_nodes.py); disk does not apply to Kafka. Against a cluster
given by --bootstrap-server only the client-side faults apply.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from onceflow.broker.embedded import BrokerStartError, EmbeddedBroker
from onceflow.log.full_disk import FULL_DISK_ENV
from onceflow.verify.history import FAIL, INFO, INVOKE, NEMESIS, OK, History
from onceflow.verify.proxy import KafkaProxy

# A supervised process that exits on its own this many times in a row, each within this many
# seconds of its start, keeps failing the same way: it is given up on (see Supervisor).
CRASH_LOOP_EXITS = 5
CRASH_LOOP_UP_S = 60.0
BROKER = "broker"  # history process and function of the broker's own exits and restarts
KILL, PAUSE, PARTITION, CRASH_CLIENT, DISK = "kill", "pause", "partition", "crash-client", "disk"
KILL_MIRROR = "kill-mirror"  # SIGKILL of the mirror's driver (verify --mirror)
LAGGING_FAILOVER = "lagging-failover"  # a leader alone in its ISR, then killed
TARGET_BROKER = "target broker"  # the mirror's target, a target of kill
FAULT_KINDS = (KILL, PAUSE, PARTITION, CRASH_CLIENT, DISK)
# On a managed Apache Kafka cluster, `all` adds the composite node fault (the embedded
# broker has no followers to lag).
APACHE_KAFKA_FAULT_KINDS = (*FAULT_KINDS, LAGGING_FAILOVER)
BROKER_ONLY = frozenset({KILL, DISK, LAGGING_FAILOVER})  # need a broker the run manages
EMBEDDED_ONLY = frozenset({DISK})  # not on a managed Apache Kafka cluster
APACHE_KAFKA_ONLY = frozenset({LAGGING_FAILOVER})  # not on the embedded broker


class FaultError(RuntimeError):
    """A fault could not be injected or healed (the broker would not restart, say)."""


class DiskUnavailableError(RuntimeError):
    """No small filesystem can be mounted here (no root, or mounts not allowed)."""


def parse_faults(text: str, mirror: bool = False, apache_kafka: bool = False) -> tuple[str, ...]:
    """`kill,pause` / `all` / `none` to fault kinds, in FAULT_KINDS order (kill-mirror and
    lagging-failover last; `all` has kill-mirror with a mirror, lagging-failover on Apache
    Kafka)."""
    kinds = (*FAULT_KINDS, KILL_MIRROR, LAGGING_FAILOVER)
    names = {n.strip() for n in text.split(",") if n.strip()}
    if names == {"none"} or not names:
        return ()
    if "all" in names:
        if apache_kafka:
            return APACHE_KAFKA_FAULT_KINDS
        return (*FAULT_KINDS, KILL_MIRROR) if mirror else FAULT_KINDS
    unknown = names - set(kinds)
    if unknown:
        raise ValueError(
            f"unknown fault(s) {', '.join(sorted(unknown))}: expected "
            f"{', '.join(kinds)}, all or none"
        )
    return tuple(k for k in kinds if k in names)


class Clients(Protocol):
    """The client processes, as the nemesis needs them (see workers.WorkerPool)."""

    def names(self, roles: tuple[str, ...] | None = None) -> list[str]: ...
    def pause(self, name: str, moment: str = "any") -> str: ...
    def resume(self, name: str) -> None: ...
    def crash(self, name: str, moment: str = "any") -> str: ...
    def start(self, name: str) -> str: ...


class NodeFaults(Protocol):
    """The nodes of a cluster the run manages (verify --apache-kafka: kafka_nodes.ManagedKafka):
    which to strike, and how. Each call returns details for the history."""

    def choose(self, rng: random.Random) -> Any: ...  # a kafka_nodes.NodeChoice
    def address(self, node: int) -> tuple[str, int]: ...  # as the node advertises it
    def kill(self, node: int) -> dict[str, Any]: ...
    def restart(self, node: int) -> dict[str, Any]: ...
    def pause(self, node: int) -> dict[str, Any]: ...
    def resume(self, node: int) -> dict[str, Any]: ...
    # lagging-failover: one for a workload partition drawn with rng (a LaggingFailover)
    def lagging_failover(self, rng: random.Random) -> Any: ...


class Mirror(Protocol):
    """The mirror's driver, as the nemesis needs it (see mirror_run.SupervisedMirror)."""

    def ready(self) -> bool: ...
    def kill(self) -> dict[str, int]: ...
    def restart(self) -> None: ...


class DatabaseServer(Protocol):
    """A database server the run started (database_workload.ManagedDatabase)."""

    def kill(self) -> None: ...
    def restart(self) -> None: ...


class SmallDisk:
    """A small tmpfs for the broker's data directory, which a ballast file can fill up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"
        self.mounted = False

    @classmethod
    def mount(cls, path: Path, size_mb: int) -> SmallDisk:
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or shutil.which("mount") is None:
            raise DiskUnavailableError("mounting a small filesystem needs root")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise DiskUnavailableError(f"mount -t tmpfs failed: {done.stderr.strip()}")
        disk = cls(path)
        disk.mounted = True
        return disk

    def free_bytes(self) -> int:
        stat = os.statvfs(self.path)
        return stat.f_bavail * stat.f_frsize

    def fill(self) -> int:
        """Take every free byte; returns how many the ballast holds."""
        held = 0
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            chunk = 1 << 30
            while chunk >= 4096:
                try:
                    os.posix_fallocate(fd, held, chunk)
                    held += chunk
                except OSError as e:
                    if e.errno not in (errno.ENOSPC, errno.EFBIG):
                        raise
                    chunk //= 2
        finally:
            os.close(fd)
        return held

    def fill_up(self) -> dict[str, Any]:
        return {"ballast_bytes": self.fill(), "free_bytes": self.free_bytes()}

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def unmount(self) -> None:
        if not self.mounted:
            return
        done = subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
        if done.returncode != 0:  # still busy: detach now, released when the last file closes
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
        self.mounted = False


class SimulatedFullDisk:
    """Where no small filesystem can be mounted: the broker's log layer fails every write with
    ENOSPC while a flag file exists (onceflow.log.full_disk), as a full disk would."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    @property
    def broker_env(self) -> dict[str, str]:
        return {FULL_DISK_ENV: str(self.flag)}

    def fill_up(self) -> dict[str, Any]:
        self.flag.touch()
        return {"simulated": True}

    def free(self) -> None:
        self.flag.unlink(missing_ok=True)

    def unmount(self) -> None:
        self.free()


class Supervisor:
    """A child process restarted whenever it exits on its own, as a service manager restarts
    it; its exits and restarts go in the history (process `name`). The nemesis holds it down
    (`_held`, under `_lock`) while it kills it on purpose. Subclasses give the process and how
    to bring it back.

    With a `crash_loop` limit, a process that keeps failing the same way is not restarted
    forever (systemd's start limit): after `crash_loop` exits on its own in a row, each before
    it had been up `crash_loop_up_s`, the supervisor gives up and says why in `failure`, which
    the run reports as an error, instead of restarting it until the run's deadline. The
    broker's supervisor sets none: a disk the nemesis holds full halts it at every start, by
    design, for as long as the fault lasts."""

    def __init__(
        self,
        name: str,
        history: History,
        crash_loop: int | None = None,
        crash_loop_up_s: float = CRASH_LOOP_UP_S,
    ) -> None:
        self.name, self.history = name, history
        self.exits = 0  # exits the nemesis did not cause
        self.restarts = 0
        self.failure: str | None = None  # why it was given up on
        self.crash_loop, self.crash_loop_up_s = crash_loop, crash_loop_up_s
        self._held = False
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"verify-{name}", daemon=True)

    def _process(self) -> subprocess.Popen[Any] | None:
        raise NotImplementedError

    def _revive(self, exited: subprocess.Popen[Any]) -> None:
        """Bring the process back after it exited on its own (exits counted already)."""
        raise NotImplementedError

    def _last_words(self) -> str:
        """The last thing the process said before it exited (its error, if it gave one)."""
        return ""

    def _note(self, event: str, **details: Any) -> None:
        self.history.append(self.name, INFO, self.name, {"event": event, **details})

    def _watch(self) -> None:
        seen: subprocess.Popen[Any] | None = None
        up_since = 0.0
        quick = 0  # exits in a row, each before it had been up crash_loop_up_s
        while not self._stop.wait(0.2):
            with self._lock:
                process = self._process()
                if process is not seen:  # a new incarnation (revived, or by the nemesis)
                    seen, up_since = process, time.monotonic()
                up_s = time.monotonic() - up_since
                if self._held or process is None or process.poll() is None:
                    if up_s >= self.crash_loop_up_s:
                        quick = 0  # stayed up: whatever failed before is over
                    continue
                self.exits += 1
                quick = quick + 1 if up_s < self.crash_loop_up_s else 0
                if self.crash_loop is not None and quick >= self.crash_loop:
                    self._give_up(process, quick)
                    return
                self._revive(process)

    def _give_up(self, exited: subprocess.Popen[Any], exits: int) -> None:
        words = self._last_words()
        self.failure = (
            f"the {self.name.replace('-', ' ')} exited {exits} times in a row, each within "
            f"{self.crash_loop_up_s:g} s of its start (last exit code {exited.returncode}"
            + (f": {words}" if words else "")
            + "); not restarted again"
        )
        self._note("gave-up", code=exited.returncode, error=words)

    def _stop_watching(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)


class SupervisedBroker(Supervisor):
    """The embedded broker, restarted whenever it exits on its own, as a service manager
    restarts Kafka after it halted on a failed disk (process `broker`, or the mirror's
    `target-broker`)."""

    def __init__(self, broker: EmbeddedBroker, history: History, name: str = BROKER) -> None:
        super().__init__(name, history)
        self.broker = broker

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def start(self) -> None:
        self.broker.start()
        self._thread.start()

    def running(self) -> bool:
        process = self.broker.process
        return process is not None and process.poll() is None

    def kill(self) -> None:
        with self._lock:
            self._held = True
            self.broker.kill()

    def restart(self) -> None:
        with self._lock:
            restart_broker(self.broker)
            self._held = False

    def pause(self) -> None:
        self.broker.pause()

    def resume(self) -> None:
        if self.running():
            self.broker.resume()

    def _process(self) -> subprocess.Popen[Any] | None:
        return self.broker.process

    def _revive(self, exited: subprocess.Popen[Any]) -> None:
        self._note("exited", code=exited.returncode, tail=self.broker.output[-3:])
        while not self._stop.is_set():
            try:
                self.broker.start()
                self.restarts += 1
                self._note("restarted")
                return
            except BrokerStartError as e:
                self._note("restart-failed", error=str(e).splitlines()[-1:])
                self._stop.wait(1.0)

    def stop(self) -> int | None:
        """Stop supervising, then stop the broker cleanly; returns its exit code."""
        self._stop_watching()
        self.resume()
        return self.broker.stop()


@dataclass
class Targets:
    broker: SupervisedBroker | None
    clients: Clients
    proxy: KafkaProxy | None
    disk: SmallDisk | SimulatedFullDisk | None
    mirror: Mirror | None = None  # verify --mirror: its driver...
    mirror_target: SupervisedBroker | None = None  # ...and its target broker, killed as the source
    # Client roles whose processes are paused or crashed most (the transactional ones).
    writers: tuple[str, ...] = ("producer", "copier")
    nodes: NodeFaults | None = None  # verify --apache-kafka: the cluster's nodes
    # When a writer is paused or crashed: any time, inside a transaction, or committing (the
    # database workload strikes its loaders only inside their database transactions).
    moments: tuple[str, ...] = ("any", "in-txn", "committing")  # workers.MOMENTS
    # verify --workload database --postgres: the run's PostgreSQL server, a target of kill
    database: DatabaseServer | None = None


def restart_broker(broker: EmbeddedBroker, attempts: int = 3) -> None:
    for attempt in range(attempts):
        try:
            broker.start()
            return
        except BrokerStartError as e:
            if attempt == attempts - 1:
                raise FaultError(f"the broker does not restart: {e}") from e


class Nemesis:
    """Injects the chosen faults one at a time, in a thread, until stopped."""

    def __init__(
        self,
        kinds: tuple[str, ...],
        targets: Targets,
        history: History,
        rng: random.Random,
        calm: tuple[float, float] = (1.0, 4.0),
        scale: float = 1.0,
    ) -> None:
        self.kinds, self.targets, self.history, self.rng = kinds, targets, history, rng
        self.calm = calm
        self.scale = scale  # hold times are for a 10 s transaction timeout; scaled with it
        self._deck: list[str] = []
        self.injected: dict[str, int] = dict.fromkeys(kinds, 0)
        self.current: str | None = None
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verify-nemesis", daemon=True)

    def start(self) -> None:
        if self.kinds:
            self._thread.start()

    def stop(self, timeout: float = 120) -> None:
        """Heal the fault in progress and stop injecting."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.rng.uniform(*self.calm)):
                if not self._deck:  # every kind once per round, in a random order
                    self._deck = list(self.kinds)
                    self.rng.shuffle(self._deck)
                self._one(self._deck.pop())
        except (FaultError, OSError) as e:
            self.error = e
            self.history.append(NEMESIS, INFO, "error", {"error": str(e)})

    def _one(self, kind: str) -> None:
        plan = self._plan(kind)
        if plan is None:
            return
        hold, inject, heal = plan.pop("hold"), plan.pop("inject"), plan.pop("heal")
        self.history.append(NEMESIS, INVOKE, kind, plan)
        self.current = f"{kind} {plan.get('target', '')} {plan.get('mode', '')}".strip()
        try:
            extra = inject() or {}
        except (FaultError, OSError) as e:
            self.history.append(NEMESIS, FAIL, kind, {**plan, "error": str(e)})
            self.current = None
            return
        self.injected[kind] += 1
        self._stop.wait(hold)
        try:
            healed = heal() or {}
        except (FaultError, OSError) as e:
            self.history.append(NEMESIS, FAIL, kind, {**plan, **extra, "error": str(e)})
            raise
        finally:
            self.current = None
        self.history.append(NEMESIS, OK, kind, {**plan, **extra, **healed})

    # -- plans: what to do, for how long, and how to undo it --------------------------------

    def _plan(self, kind: str) -> dict[str, Any] | None:
        t, rng = self.targets, self.rng
        if kind == KILL and t.database is not None and rng.random() < 0.5:
            database = t.database
            hold = rng.uniform(0.2, 3.0)
            return self._make("database server", hold, database.kill, database.restart)
        if kind == KILL and t.broker is not None:
            broker, name = t.broker, "broker"
            if t.mirror_target is not None and rng.random() < 0.5:
                broker, name = t.mirror_target, TARGET_BROKER
            return self._make(name, rng.uniform(0.2, 3.0), broker.kill, broker.restart)
        if kind == KILL and t.nodes is not None:
            nodes = t.nodes
            return self._node_fault(nodes, rng.uniform(0.2, 3.0), nodes.kill, nodes.restart)
        if kind == KILL_MIRROR and t.mirror is not None and t.mirror.ready():
            mirror = t.mirror
            return self._make("mirror driver", rng.uniform(0.2, 3.0), mirror.kill, mirror.restart)
        if kind == PAUSE:
            if t.nodes is not None and rng.random() < 0.5:
                nodes = t.nodes
                return self._node_fault(nodes, self._hold(2.0, 10.0), nodes.pause, nodes.resume)
            if t.broker is not None and rng.random() < 0.4:
                broker = t.broker
                hold = self._hold(2.0, 10.0)
                return self._make("broker", hold, broker.pause, broker.resume)
            return self._client_fault(
                lambda: self._hold(3.0, 15.0), t.clients.pause, t.clients.resume
            )
        if kind == CRASH_CLIENT:
            return self._client_fault(
                lambda: rng.uniform(0.0, 2.0),
                t.clients.crash,
                lambda name: {"restarted": t.clients.start(name)},
            )
        if kind == PARTITION and t.proxy is not None:
            return self._partition(t.proxy)
        if kind == LAGGING_FAILOVER and t.nodes is not None:
            failover = t.nodes.lagging_failover(rng)
            failover.interrupted = self._stop.is_set
            # Held long enough for the workload to write to the lone leader.
            plan = self._make(
                f"leader of {failover.of}",
                self._hold(2.0, 6.0),
                failover.strand,
                failover.fail_over,
            )
            plan["node_role"] = "partition leader"
            plan["of"] = failover.of
            return plan
        if kind == DISK and t.disk is not None:
            disk = t.disk
            return self._make(
                "broker data directory",
                self._hold(2.0, 8.0),
                disk.fill_up,
                disk.free,
            )
        return None

    def _node_fault(
        self,
        nodes: NodeFaults,
        hold: float,
        strike: Callable[[int], Any],
        heal: Callable[[int], Any],
        target: str = "node {}",
    ) -> dict[str, Any]:
        """A fault on one node of a managed cluster, chosen by what it does for the workload
        (the leader of a partition, a coordinator, or any node)."""
        choice = nodes.choose(self.rng)
        node = choice.node
        plan = self._make(target.format(node), hold, lambda: strike(node), lambda: heal(node))
        plan["node_role"] = choice.role
        if choice.of:
            plan["of"] = choice.of
        if choice.note:
            plan["note"] = choice.note
        return plan

    def _partition(self, proxy: KafkaProxy) -> dict[str, Any] | None:
        rng = self.rng
        nodes = self.targets.nodes
        if nodes is not None and rng.random() < 0.5:
            return self._node_partition(proxy, nodes)
        everyone = self.targets.clients.names()
        if not everyone:
            return None
        isolated = everyone if rng.random() < 0.3 else [rng.choice(everyone)]
        target = "all clients" if len(isolated) > 1 else isolated[0]
        mode = rng.choice(("cut", "blackhole", "delay"))
        hold = self._hold(2.0, 10.0)
        latency = round(rng.uniform(0.05, 1.0), 3)
        inject: Callable[[], Any] = {
            "cut": partial(proxy.cut, isolated),
            "blackhole": partial(proxy.blackhole, isolated),
            "delay": partial(proxy.delay, isolated, latency),
        }[mode]
        plan = self._make(target, hold, inject, partial(proxy.heal, isolated))
        plan["mode"] = mode
        if mode == "delay":
            plan["latency_s"] = latency
        return plan

    def _node_partition(self, proxy: KafkaProxy, nodes: NodeFaults) -> dict[str, Any]:
        """One node cut off from every client (cut, black-holed or delayed) while the nodes
        still reach each other: its clients see it gone, the cluster sees it well."""
        rng = self.rng
        mode = rng.choice(("cut", "blackhole", "delay"))
        hold = self._hold(2.0, 10.0)
        latency = round(rng.uniform(0.05, 1.0), 3)
        plan = self._node_fault(
            nodes,
            hold,
            lambda node: proxy.isolate_node(nodes.address(node), mode, latency),
            lambda node: proxy.heal_node(nodes.address(node)),
            "node {} from all clients",
        )
        plan["mode"] = mode
        if mode == "delay":
            plan["latency_s"] = latency
        return plan

    def _client_fault(
        self,
        hold: Callable[[], float],
        strike: Callable[[str, str], Any],
        heal: Callable[[str], Any],
    ) -> dict[str, Any] | None:
        """A fault on one client process: which one, at what moment of its work, held how
        long (drawn in that order: a seed replays the same faults)."""
        name = self._client()
        if name is None:
            return None
        moment = self._moment(name)
        plan = self._make(
            name, hold(), lambda: {"process": strike(name, moment)}, lambda: heal(name)
        )
        return {**plan, "moment": moment}

    def _hold(self, low: float, high: float) -> float:
        return self.rng.uniform(low, high) * self.scale

    def _moment(self, name: str) -> str:
        """When to strike a transactional client: any time, inside a transaction, or while
        its commit is in flight (the outcome is then unknown to it)."""
        if name not in self.targets.clients.names(self.targets.writers):
            return "any"
        return self.rng.choice(self.targets.moments)

    def _client(self) -> str | None:
        clients = self.targets.clients
        writers = clients.names(self.targets.writers)
        pool = writers if writers and self.rng.random() < 0.75 else clients.names()
        return self.rng.choice(pool) if pool else None

    @staticmethod
    def _make(
        target: str, hold: float, inject: Callable[[], Any], heal: Callable[[], Any]
    ) -> dict[str, Any]:
        return {
            "target": target,
            "seconds": round(hold, 3),
            "hold": hold,
            "inject": inject,
            "heal": heal,
        }
