"""Failures reach the user as one line on stderr with exit code 1 or 2, never a traceback."""

from __future__ import annotations

import time

import pytest

from tests.cli.harness import Run, closed_port_address, run_subprocess

COMMANDS = [
    ("topics", "list"),
    ("topics", "create", "t"),
    ("topics", "describe"),
    ("topics", "delete", "t"),
    ("produce", "t"),
    ("consume", "t", "--timeout-ms", "100"),
    ("groups", "list"),
    ("groups", "describe", "g"),
    ("groups", "reset-offsets", "g", "--topic", "t", "--to-earliest"),
    ("groups", "delete", "g"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_unreachable_broker_fails_fast_in_one_line(run: Run, command: tuple[str, ...]) -> None:
    address = closed_port_address()
    started = time.monotonic()
    outcome = run(*command, "--bootstrap-server", address, input="x\n")
    assert outcome.exit_code == 1
    line = outcome.assert_one_error_line()
    assert line.startswith(f"Error: Cannot reach a broker at {address}: ")
    assert "Connection refused" in line
    assert time.monotonic() - started < 5


def test_unresolvable_host(run: Run) -> None:
    outcome = run("topics", "list", "-b", "no-such-host.invalid:9092")
    assert outcome.exit_code == 1
    assert "Failed to resolve 'no-such-host.invalid:9092'" in outcome.assert_one_error_line()


@pytest.mark.parametrize("address", ["localhost", "host:port", ":9092", "h:0", "h:70000", ","])
def test_malformed_bootstrap_address_is_a_usage_error(run: Run, address: str) -> None:
    outcome = run("topics", "list", "--bootstrap-server", address)
    assert outcome.exit_code == 2
    assert "expected HOST:PORT" in outcome.assert_one_error_line()


def test_real_entry_point_prints_no_traceback() -> None:
    address = closed_port_address()
    outcome = run_subprocess(["groups", "list", "-b", address])
    assert outcome.exit_code == 1
    assert outcome.assert_one_error_line().startswith(f"Error: Cannot reach a broker at {address}")
    assert outcome.stdout == ""


def test_usage_errors_name_the_help_to_read(run: Run) -> None:
    outcome = run("consume")
    assert outcome.exit_code == 2
    assert outcome.assert_one_error_line() == (
        "Error: Missing argument 'TOPIC'. (see 'onceflow consume --help')"
    )
