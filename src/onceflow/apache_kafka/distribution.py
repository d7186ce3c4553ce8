"""Apache Kafka's jars: a binary distribution's libs/, or the pom beside this module fetched once
with Maven into a cache outside git (~/.cache/onceflow/apache-kafka/<version>/libs).

MirrorMaker 2 is a set of its own (mirror-maker.pom.xml, fetched into
<version>-mirror-maker/libs): the registry serves connect-mirror only up to 4.3.1, and 4.3.1's
jars beside 4.4.0's fail (NoClassDefFoundError: 4.4.0 moved classes 4.3.1 uses, such as
common.utils.AppInfoParser)."""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# A libs/ folder (or a distribution directory holding one) to use instead of the cache.
LIBS_ENV = "ONCEFLOW_APACHE_KAFKA"
# Where fetched versions are kept, one folder per version.
CACHE_ENV = "ONCEFLOW_APACHE_KAFKA_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "onceflow" / "apache-kafka"
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
# The jar whose presence says a folder is Kafka's libs/ (the broker: kafka.Kafka, StorageTool).
BROKER_JAR = "kafka_2.13-*.jar"
# Written into a fetched libs/: the digest of the pom it came from, so a pom that gains an
# artifact (kafka-streams, connect-mirror) makes the next run fetch again.
POM_STAMP = ".pom-sha256"
FETCH_TIMEOUT_S = 1800
MIRROR_MAKER_POM = "mirror-maker.pom.xml"
# The jar whose presence says a folder holds MirrorMaker 2 (org.apache.kafka.connect.mirror).
MIRROR_MAKER_JAR = "connect-mirror-[0-9]*.jar"
MIRROR_MAKER_MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A `preexec_fn` for Kafka's JVMs: SIGKILLed when the thread that started them ends, so
    no JVM is orphaned even when the Python process is itself SIGKILLed (atexit does not run
    then). Linux only; only from the main thread's Popen, as the kernel ties it to the thread."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class MissingTool(RuntimeError):
    """A program Apache Kafka needs here (java, mvn) is not installed; the message names it."""


def pom_path(name: str = "pom.xml") -> Path:
    return Path(str(resources.files("onceflow.apache_kafka").joinpath(name)))


def pinned_version(pom: Path | None = None) -> str:
    """The Kafka release the pom (pom.xml unless given) pins (its kafka.version property)."""
    pom = pom or pom_path()
    root = ET.parse(pom).getroot()
    version = root.find("m:properties/m:kafka.version", POM_NS)
    if version is None or not version.text:
        raise ValueError(f"{pom} has no kafka.version property")
    return version.text.strip()


@dataclass(frozen=True)
class JarSet:
    """What one pom fetches: into `<cache>/<version><suffix>/libs`, told by its `marker` jar."""

    pom: Path
    marker: str
    suffix: str = ""
    name: str = "Apache Kafka"

    def folder(self, version: str) -> Path:
        return cache_root() / f"{version}{self.suffix}"


def kafka_jars() -> JarSet:
    return JarSet(pom_path(), BROKER_JAR)


def mirror_maker_jars() -> JarSet:
    return JarSet(pom_path(MIRROR_MAKER_POM), MIRROR_MAKER_JAR, "-mirror-maker", "MirrorMaker 2")


def mirror_maker_version() -> str:
    """The release of MirrorMaker 2 that mirror-maker.pom.xml pins (4.3.1: see the module doc)."""
    return pinned_version(pom_path(MIRROR_MAKER_POM))


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


@dataclass(frozen=True)
class Distribution:
    """A folder of Kafka's jars, run as `java -cp 'libs/*' MAIN ...`."""

    libs: Path

    @property
    def classpath(self) -> str:
        return str(self.libs / "*")

    def command(
        self, main: str, *args: str, heap: str = "256m", options: Sequence[str] = ()
    ) -> list[str]:
        """`java ... MAIN ARGS` for one of Kafka's programs (a tool's main class, MirrorMaker,
        a Streams application): small heap, serial GC and C1 only, as tools run short and
        these machines have 2 cores."""
        return [
            require_java(),
            f"-Xmx{heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            *options,
            "-cp",
            self.classpath,
            main,
            *args,
        ]

    @property
    def version(self) -> str:
        jar = next(iter(sorted(self.libs.glob(BROKER_JAR))), None)
        if jar is None:
            return "unknown"
        return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")


def libs_of(directory: str | Path) -> Path:
    """The libs/ folder of a binary distribution directory, or the directory itself when it is
    one; ValueError when it holds no Kafka broker jar."""
    path = Path(directory).expanduser()
    for candidate in (path / "libs", path):
        if candidate.is_dir() and any(candidate.glob(BROKER_JAR)):
            return candidate
    raise ValueError(
        f"{path} is neither Apache Kafka's libs/ folder nor a distribution holding one"
    )


def pom_digest(pom: Path | None = None) -> str:
    return hashlib.sha256((pom or pom_path()).read_bytes()).hexdigest()


def cached_libs(version: str | None = None, jars: JarSet | None = None) -> Path | None:
    """The cache's libs/ for this version, fetched from the pom as it is now; None otherwise."""
    jars = jars or kafka_jars()
    libs = jars.folder(version or pinned_version(jars.pom)) / "libs"
    stamp = libs / POM_STAMP
    if not (libs.is_dir() and any(libs.glob(jars.marker)) and stamp.is_file()):
        return None
    return libs if stamp.read_text().strip() == pom_digest(jars.pom) else None


def require_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise MissingTool("java is not installed (Apache Kafka needs Java 17 or later)")
    return java


def fetch(version: str | None = None, *, quiet: bool = True, jars: JarSet | None = None) -> Path:
    """Fetch the pinned (or given) release's jars with Maven into the cache, once; returns the
    libs/ folder. Concurrent callers (two test workers) wait for one fetch under a file lock."""
    jars = jars or kafka_jars()
    version = version or pinned_version(jars.pom)
    found = cached_libs(version, jars)
    if found is not None:
        return found
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MissingTool(
            f"mvn is not installed: it fetches {jars.name} {version}'s jars from Maven Central "
            f"(or set {LIBS_ENV} to a Kafka distribution or its libs/ folder)"
        )
    target = jars.folder(version)
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = cached_libs(version, jars)
        if found is not None:
            return found
        # Copied into a scratch folder first and renamed: a fetch cut short leaves no libs/.
        scratch = Path(tempfile.mkdtemp(prefix="libs-", dir=target))
        command = [
            mvn,
            "-B",
            "-Dstyle.color=never",
            *(["-q"] if quiet else []),
            "-f",
            str(jars.pom),
            f"-Dkafka.version={version}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={scratch}",
        ]
        try:
            # Quiet: Maven's output is kept for the error only (mvn 3.8 -q still prints colour
            # codes).
            done = subprocess.run(
                command, capture_output=quiet, text=True, timeout=FETCH_TIMEOUT_S, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(
                    f"mvn could not fetch {jars.name} {version} (exit {done.returncode}):\n"
                    + (done.stdout or "")[-4000:]
                    + (done.stderr or "")[-4000:]
                )
            (scratch / POM_STAMP).write_text(pom_digest(jars.pom) + "\n")
            # A libs/ from an older pom is set aside, not merged into: its jars may clash.
            stale = target / "libs"
            if stale.exists():
                shutil.rmtree(stale)
            scratch.rename(stale)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    libs = target / "libs"
    if not any(libs.glob(jars.marker)):
        raise RuntimeError(f"mvn finished but {libs} holds no {jars.marker}")
    return libs


def locate(directory: str | Path | None = None, *, allow_fetch: bool = True) -> Distribution:
    """Kafka's jars: the given distribution (or libs/) directory, else $ONCEFLOW_APACHE_KAFKA,
    else the cache, else fetched now (when allowed). Raises MissingTool naming what is absent."""
    require_java()
    if directory is not None:
        return Distribution(libs_of(directory))
    if os.environ.get(LIBS_ENV):
        return Distribution(libs_of(os.environ[LIBS_ENV]))
    found = cached_libs()
    if found is not None:
        return Distribution(found)
    if not allow_fetch:
        raise MissingTool(
            f"Apache Kafka {pinned_version()} is not fetched: run `python -m onceflow.apache_kafka "
            f"fetch` (needs mvn) or set {LIBS_ENV}"
        )
    return Distribution(fetch())


def fetch_mirror_maker(*, quiet: bool = True) -> Path:
    """Fetch MirrorMaker 2's own set (mirror-maker.pom.xml) once; returns its libs/ folder."""
    return fetch(mirror_maker_version(), quiet=quiet, jars=mirror_maker_jars())


def locate_mirror_maker(*, allow_fetch: bool = True) -> Distribution:
    """MirrorMaker 2's jars (run `MIRROR_MAKER_MAIN` with its command()): the cache, else
    fetched now (when allowed). Raises MissingTool naming what is absent."""
    require_java()
    found = cached_libs(mirror_maker_version(), mirror_maker_jars())
    if found is not None:
        return Distribution(found)
    if not allow_fetch:
        raise MissingTool(
            f"MirrorMaker 2 {mirror_maker_version()} is not fetched: run `python -m "
            f"onceflow.apache_kafka fetch` (needs mvn)"
        )
    return Distribution(fetch_mirror_maker())
