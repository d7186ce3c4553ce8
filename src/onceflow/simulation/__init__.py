"""Deterministic simulation of the exactly-once cores: a seeded scheduler drives the real
transaction coordinator, producer state, aborted index, partition glue and group offsets
through lost, duplicated and retried requests, clock jumps, client crashes, zombies and broker
crashes, and checks the exactly-once invariants after every step."""

from onceflow.simulation.checker import InvariantViolation
from onceflow.simulation.scheduler import (
    SimulationConfig,
    SimulationFailure,
    SimulationResult,
    replay_command,
    run_seed,
)

__all__ = [
    "InvariantViolation",
    "SimulationConfig",
    "SimulationFailure",
    "SimulationResult",
    "replay_command",
    "run_seed",
]
