"""The Kafka Streams word count (WordCount.java beside this module) as the tests run it: compiled
once with javac against Kafka's jars, run as a JVM that can be SIGKILLed and restarted on its
state directory, its output read back read_committed."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from onceflow.apache_kafka import Distribution
from onceflow.apache_kafka.distribution import die_with_parent
from tests.confluent import QUIET

HERE = Path(__file__).parent
SOURCE = HERE / "WordCount.java"
LOG4J = HERE / "log4j2.properties"
MAIN = "WordCount"
HEAP = "384m"


def require_javac() -> str:
    """javac (the JDK's, beside java); a skip naming it when absent, a failure under CI."""
    javac = shutil.which("javac")
    if javac is None:
        reason = "javac is not installed (the Kafka Streams test compiles WordCount.java)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the Kafka Streams test, but {reason}", pytrace=False)
        pytest.skip(reason)
    return javac


def compile_word_count(distribution: Distribution, classes: Path) -> Path:
    """WordCount.class into `classes`; the compiler's output in the failure when it fails."""
    classes.mkdir(parents=True, exist_ok=True)
    # javac is a JVM too: a small heap and C1 only, as Kafka's tools run here.
    command = [
        require_javac(),
        "-J-Xmx256m",
        "-J-XX:+UseSerialGC",
        "-J-XX:TieredStopAtLevel=1",
        "-cp",
        distribution.classpath,
        "-d",
        str(classes),
        str(SOURCE),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"javac failed:\n{done.stdout}\n{done.stderr}"
    return classes


class StreamsApp:
    """One WordCount JVM at a time on a properties file: started, SIGKILLed, stopped."""

    def __init__(
        self,
        distribution: Distribution,
        classes: Path,
        properties: dict[str, str],
        workdir: Path,
        input_topic: str,
        output_topic: str,
    ) -> None:
        self.distribution = distribution
        self.classes = classes
        self.properties = dict(properties)
        self.workdir = workdir
        self.input_topic = input_topic
        self.output_topic = output_topic
        self.process: subprocess.Popen[str] | None = None
        self.output: deque[str] = deque(maxlen=300)
        self.states: list[str] = []
        self.starts = 0

    def repartition_topic(self, name: str) -> str:
        return f"{self.properties['application.id']}-{name}-repartition"

    @property
    def state_dir(self) -> Path:
        return Path(self.properties["state.dir"])

    def command(self) -> list[str]:
        path = self.workdir / "streams.properties"
        path.write_text("".join(f"{key}={value}\n" for key, value in self.properties.items()))
        command = self.distribution.command(
            MAIN,
            str(path),
            self.input_topic,
            self.output_topic,
            heap=HEAP,
            options=[f"-Dlog4j2.configurationFile={LOG4J}"],
        )
        # The compiled class ahead of Kafka's jars.
        at = command.index("-cp") + 1
        command[at] = f"{self.classes}{os.pathsep}{command[at]}"
        return command

    def start(self) -> StreamsApp:
        assert self.process is None or self.process.poll() is not None
        self.starts += 1
        self.output.append(f"--- start {self.starts}")
        self.states = []
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            preexec_fn=(
                die_with_parent if threading.current_thread() is threading.main_thread() else None
            ),
        )
        threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()
        return self

    def _pump(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        with open(self.workdir / "streams.log", "a") as log:
            for line in process.stdout:
                log.write(line)
                self.output.append(line.rstrip())
                if line.startswith("STATE "):
                    self.states.append(line.split()[1])

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 60) -> str:
        return "\n".join(list(self.output)[-lines:])

    def check_alive(self) -> None:
        """Fails the test, with the JVM's last lines, when Streams has exited on its own."""
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"Kafka Streams exited with {self.process.returncode}:\n{self.tail()}"
            )

    def wait_running(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while "RUNNING" not in self.states:
            self.check_alive()
            assert time.monotonic() < deadline, (
                f"Streams not RUNNING in {timeout} s:\n{self.tail()}"
            )
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no close, no commit, no checkpoint file, an open transaction left open."""
        if self.alive():
            assert self.process is not None
            self.process.kill()
            self.process.wait()

    def pause(self) -> None:
        """SIGSTOP: a zombie, frozen with whatever transaction it has open."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM: the shutdown hook closes Streams (commits, writes its checkpoints)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired as e:
                self.process.kill()
                self.process.wait()
                raise AssertionError(f"Streams did not close in {timeout} s:\n{self.tail()}") from e
        return self.process.returncode


class CountsReader:
    """The output topic read read_committed from its start, kept as it grows: every committed
    (word, count) in offset order, and each word's partition."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"counts-reader-{topic}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                **QUIET,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.sequences: dict[str, list[int]] = {}
        self.partition_of: dict[str, set[int]] = {}
        self.records = 0

    def poll(self, timeout: float = 0.5) -> None:
        for msg in self.consumer.consume(1000, timeout=timeout):
            error = msg.error()
            if error is not None:
                # A broker down for a moment is retried by librdkafka; anything else is a bug.
                if error.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
                    continue
                raise AssertionError(f"reading the counts: {error}")
            word = msg.key().decode()
            (count,) = struct.unpack(">q", msg.value())
            self.sequences.setdefault(word, []).append(count)
            self.partition_of.setdefault(word, set()).add(msg.partition())
            self.records += 1

    def latest(self) -> dict[str, int]:
        return {word: counts[-1] for word, counts in self.sequences.items()}

    def close(self) -> None:
        self.consumer.close()
