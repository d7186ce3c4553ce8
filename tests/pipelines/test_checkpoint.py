"""A driver killed while Spark wrote its first offset-log entry leaves a temporary file that
makes Spark 4 refuse the restarted query for good; the pipelines clear it before they start."""

from __future__ import annotations

from pathlib import Path

from onceflow.pipelines.checkpoint import clear_unfinished_first_batch, has_offsets


def plant(checkpoint: Path, *names: str) -> list[Path]:
    paths = [checkpoint / name for name in names]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("v1\n")
    return paths


def test_a_first_batch_cut_short_leaves_nothing_behind(tmp_path: Path) -> None:
    debris = plant(tmp_path, "offsets/.0.26cbb7c1.tmp", "offsets/..0.26cbb7c1.tmp.crc")
    kept = plant(tmp_path, "metadata", ".metadata.crc")
    assert sorted(clear_unfinished_first_batch(str(tmp_path))) == sorted(debris)
    assert not list((tmp_path / "offsets").iterdir())
    assert all(path.exists() for path in kept)


def test_a_checkpoint_with_a_batch_is_left_as_it_is(tmp_path: Path) -> None:
    files = plant(tmp_path, "offsets/0", "offsets/.1.5d1fa8e7.tmp", "commits/.0.93b811ad.tmp")
    assert has_offsets(str(tmp_path))
    assert clear_unfinished_first_batch(str(tmp_path)) == []
    assert all(path.exists() for path in files)


def test_a_new_or_remote_checkpoint_is_not_touched(tmp_path: Path) -> None:
    assert clear_unfinished_first_batch(str(tmp_path / "absent")) == []
    assert clear_unfinished_first_batch("s3a://bucket/checkpoint") == []
    assert clear_unfinished_first_batch(f"file://{tmp_path}") == []
