"""MirrorMaker 2 in dedicated mode (`connect-mirror-maker.sh`'s main class) as a child JVM of a
test: one replication flow source->target, exactly-once on the target (KIP-618), its output in
a log file whose tail a failing test shows."""

from __future__ import annotations

import signal
import subprocess
import threading
from pathlib import Path

from onceflow.apache_kafka.distribution import (
    MIRROR_MAKER_MAIN,
    Distribution,
    die_with_parent,
    locate_mirror_maker,
)
from tests.apache_kafka.fixtures import require

LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
appender.out.type = File
appender.out.name = OUT
appender.out.fileName = {log}
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
"""


def require_mirror_maker() -> Distribution:
    """MirrorMaker 2's own set of jars, or a skip (a failure under CI) naming what is missing."""
    return require(locate_mirror_maker, "MirrorMaker 2")


def mm2_properties(source: str, target: str, topics: str, groups: str) -> str:
    """Aliases `source` and `target`; every interval short so a test sees checkpoints and
    group syncs within seconds; replication factors 1 (one broker each)."""
    return f"""\
clusters = source, target
source.bootstrap.servers = {source}
target.bootstrap.servers = {target}
source->target.enabled = true
target->source.enabled = false
source->target.topics = {topics}
source->target.groups = {groups}
# KIP-618 on the target's Connect worker: records and source offsets in one transaction
target.exactly.once.source.support = enabled
# only committed source records are copied (the replication consumer reads read_uncommitted
# by default, so aborted records would be mirrored as if committed)
source.consumer.isolation.level = read_committed
replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
emit.checkpoints.enabled = true
emit.checkpoints.interval.seconds = 1
sync.group.offsets.enabled = true
sync.group.offsets.interval.seconds = 1
emit.heartbeats.interval.seconds = 1
refresh.topics.interval.seconds = 2
refresh.groups.interval.seconds = 2
# an offset sync for every record, so translations are as close as MM2's can be
offset.lag.max = 0
# ACL sync left on: onceflow without an authorizer answers DescribeAcls SECURITY_DISABLED, as
# Kafka does, and MM2 logs that it syncs no ACLs
offset.flush.interval.ms = 1000
# a SIGKILLed worker's tasks go to the restarted one without Connect's 5-minute wait
scheduled.rebalance.max.delay.ms = 0
"""


class MirrorMaker:
    """`MirrorMaker mm2.properties --clusters target`, a child JVM (one process)."""

    def __init__(
        self,
        directory: Path,
        distribution: Distribution,
        *,
        source: str,
        target: str,
        topics: str,
        groups: str = ".*",
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.distribution = distribution
        self.properties = self.directory / "mm2.properties"
        self.properties.write_text(mm2_properties(source, target, topics, groups))
        self.log = self.directory / "mirror-maker.log"
        self.log4j = self.directory / "log4j2.properties"
        self.log4j.write_text(LOG4J2.format(log=self.log))
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> MirrorMaker:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        command = self.distribution.command(
            MIRROR_MAKER_MAIN,
            str(self.properties),
            "--clusters",
            "target",
            heap="256m",
            options=[f"-Dlog4j2.configurationFile={self.log4j}"],
        )
        main_thread = threading.current_thread() is threading.main_thread()
        with open(self.directory / f"stdout-{self.starts}.txt", "wb") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent if main_thread else None,
            )
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash: no task commits, no producer closes, no group leave."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if not self.running():
            return
        assert self.process is not None
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)

    def tail(self, lines: int = 40) -> str:
        """The log's last lines, and the errors and warnings in it (for a failure message)."""
        if not self.log.exists():
            return "(no MirrorMaker log)"
        text = self.log.read_text(errors="replace").splitlines()
        problems = [line for line in text if " ERROR " in line or " WARN " in line][-20:]
        return "\n".join(["-- errors/warnings:", *problems, "-- last lines:", *text[-lines:]])
