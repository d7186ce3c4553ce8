"""The property tests run under the "ci" profile (tests/conftest.py) unless asked otherwise."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings


@pytest.mark.skipif("HYPOTHESIS_PROFILE" in os.environ, reason="another profile was asked for")
def test_no_deadline_and_fixed_examples() -> None:
    assert settings().deadline is None
    assert settings().derandomize


@pytest.mark.skipif("HYPOTHESIS_PROFILE" in os.environ, reason="another profile was asked for")
def test_a_test_that_sets_its_own_count_keeps_the_profile() -> None:
    # what @settings(max_examples=...) on a test builds: the rest comes from the loaded profile
    own = settings(max_examples=7)
    assert own.deadline is None and own.derandomize and own.max_examples == 7
