"""`python -m onceflow.apache_kafka fetch`: fetch the pinned Apache Kafka once into the cache, and
MirrorMaker 2's own set beside it (unless --version names another release).
`python -m onceflow.apache_kafka run DIR --nodes 3`: run a cluster there until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import time

from onceflow.apache_kafka.cluster import KafkaCluster
from onceflow.apache_kafka.distribution import (
    MissingTool,
    cached_libs,
    fetch,
    mirror_maker_jars,
    mirror_maker_version,
    pinned_version,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onceflow.apache_kafka")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = commands.add_parser("fetch", help="fetch Apache Kafka's jars with Maven, once")
    fetch_cmd.add_argument("--version", default=None, help=f"default: {pinned_version()}")
    run_cmd = commands.add_parser("run", help="run a cluster on loopback until Ctrl-C")
    run_cmd.add_argument("directory")
    run_cmd.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            sets = [(args.version or pinned_version(), None)]
            if args.version is None:  # MirrorMaker 2 tests need its set too (.ci/run calls this)
                sets.append((mirror_maker_version(), mirror_maker_jars()))
            for version, jars in sets:
                cached = cached_libs(version, jars)
                started = time.monotonic()
                libs = cached or fetch(version, jars=jars)
                took = (
                    "already cached" if cached else f"fetched in {time.monotonic() - started:.1f} s"
                )
                name = "Apache Kafka" if jars is None else jars.name
                print(f"{name} {version}: {libs} ({took})")
            return 0
        with KafkaCluster(args.directory, args.nodes) as cluster:
            stop = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop)
            print(f"bootstrap.servers={cluster.bootstrap_servers}")
            print("pids=" + ",".join(str(p) for p in cluster.pids().values()), flush=True)
            signal.sigwait(stop)
        return 0
    except MissingTool as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # mvn failed, or a node did not start
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
