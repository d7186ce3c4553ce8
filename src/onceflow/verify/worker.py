"""Entry point of one client process of a verify run: `python -m onceflow.verify.worker JSON`.

The harness starts it with its WorkerSpec and the WorkloadSpec as one JSON argument, reads its
operations from stdout and may SIGSTOP, SIGCONT or SIGKILL it at any time. SIGTERM asks it to
finish its current operation and exit.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from types import FrameType

from onceflow.verify.history import INFO, WORKER
from onceflow.verify.workload import (
    LOADER,
    RUNNERS,
    ClientError,
    OpStream,
    WorkerSpec,
    WorkloadSpec,
)

EXIT_CLIENT_ERROR = 3


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m onceflow.verify.worker JSON", file=sys.stderr)
        return 2
    config = json.loads(argv[0])
    spec = WorkerSpec.from_json(config["worker"])
    workload = WorkloadSpec.from_json(config["workload"])
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    stream = OpStream(sys.stdout.fileno())
    stream.emit(INFO, WORKER, {"event": "started", "role": spec.role})
    try:
        if spec.role == LOADER:  # imported only here: SQLAlchemy would slow every start
            from onceflow.verify.database_workload import run_loader

            run_loader(spec, workload, stream, stop)
        else:
            RUNNERS[spec.role](spec, workload, stream, stop)
    except ClientError as e:
        stream.emit(INFO, WORKER, {"event": "gave-up", "error": str(e)})
        return EXIT_CLIENT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
