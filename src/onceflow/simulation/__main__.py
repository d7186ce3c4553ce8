"""`python -m onceflow.simulation --seed N --trace` replays one seed step by step;
`--seeds COUNT [--start S]` runs many and reports the failures with their replay commands."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from onceflow.simulation.scheduler import (
    DEFAULT_STEPS,
    SimulationConfig,
    SimulationFailure,
    run_seed,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onceflow.simulation", description=__doc__)
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed of --seeds")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps before quiescing")
    parser.add_argument("--no-faults", action="store_true", help="no faults at all")
    parser.add_argument("--trace", action="store_true", help="print every step (one seed)")
    args = parser.parse_args(argv)
    # torn snapshots and index entries are simulated on purpose: their warnings are noise
    logging.basicConfig(level=logging.INFO if args.trace else logging.ERROR)
    config = SimulationConfig(steps=args.steps, faults=not args.no_faults)
    if args.seed is not None:
        try:
            result = run_seed(args.seed, config, trace=args.trace)
        except SimulationFailure as failure:
            print(f"FAIL {failure}", file=sys.stderr)
            return 1
        print(f"seed {result.seed}: ok after {result.steps} steps {result.stats}")
        return 0
    failures = 0
    started = time.monotonic()
    totals: dict[str, int] = {}
    for seed in range(args.start, args.start + args.seeds):
        try:
            result = run_seed(seed, config)
        except SimulationFailure as failure:
            failures += 1
            print(f"FAIL {failure}", file=sys.stderr, flush=True)
            continue
        for name, count in result.stats.items():
            totals[name] = totals.get(name, 0) + count
    elapsed = time.monotonic() - started
    print(f"{args.seeds} seeds, {failures} failed, {elapsed:.1f} s; totals {totals}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
