"""The bundled pipelines run as scripts, the way spark-submit runs them.

spark-submit puts a script's own folder first on sys.path, so a module in onceflow/pipelines/
named like a standard-library module (`copy.py` once) replaces it for every import, pyspark's
included, and the job dies before it starts (issue 11).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import onceflow.pipelines

PIPELINES_DIR = Path(onceflow.pipelines.__file__).parent
ONCEFLOW_DIR = PIPELINES_DIR.parent
SCRIPTS = ("wordcount.py", "file_transactions.py", "copy_topic.py", "mirror.py")


def test_no_module_of_onceflow_is_named_like_a_standard_library_module() -> None:
    # The pipelines' folder is the one spark-submit puts first on sys.path; issue 11 asks it
    # of every module of onceflow (any folder may hold a script one day).
    names = {
        (path.stem if path.suffix == ".py" else path.name): path
        for path in ONCEFLOW_DIR.rglob("*")
        if (path.suffix == ".py" and path.stem != "__init__")
        or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert "wordcount" in names and "copy_topic" in names  # the walk saw the pipelines
    shadowing = {name: str(names[name]) for name in sorted(names.keys() & sys.stdlib_module_names)}
    assert shadowing == {}


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_pipeline_script_starts_with_its_folder_first_on_sys_path(script: str) -> None:
    # `python path/to/script.py` puts the script's folder first on sys.path, as spark-submit
    # does; onceflow itself comes from PYTHONPATH, as from a wheel or --py-files on a cluster.
    path = PIPELINES_DIR / script
    assert path.exists()
    src = str(PIPELINES_DIR.parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(path), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--checkpoint" in done.stdout  # its own options, parsed: it got past the imports
