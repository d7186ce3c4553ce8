"""The disk fault's filesystem holds the whole run: a fixed 256 MB filled up 20 minutes into a
1-hour run with every fault, and the broker could no longer start."""

from __future__ import annotations

from onceflow.verify.harness import VerifyOptions


def test_the_disk_grows_with_the_run() -> None:
    assert VerifyOptions(duration_s=60).disk_mb == 256
    # the 1-hour run wrote about 13 MB a minute (256 MB full after 20 minutes)
    assert VerifyOptions(duration_s=3600).disk_mb >= 60 * 13 * 2


def test_a_size_given_is_kept() -> None:
    assert VerifyOptions(duration_s=3600, disk_size_mb=100).disk_mb == 100
