"""What lies outside log/ sees of a partition's log: UnifiedLog's public methods (read, the
appends, fetch_offset_by_timestamp, log_start_offset, maybe_increment_log_start_offset, config,
...), as Kafka's handlers see UnifiedLog, never the private parts of log/'s classes, and the
local log (`UnifiedLog.log`: segments, offsets, flushes) only where KNOWN_LOCAL_LOG_READERS says
why.

Two checks over the source text (ast), outside the `onceflow.log` package:
- no `x._name` where `_name` is a private attribute or method a class of log/ defines (on `self`
  and `cls` it is the module's own);
- `x.log` (not called: `logger.log(...)` is logging) only in the modules listed.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "onceflow"

# module (dotted) -> why it reads the local log of a UnifiedLog. Only shrinks.
KNOWN_LOCAL_LOG_READERS: dict[str, str] = {
    "onceflow.broker.handlers.produce": "the log start offset of a refused batch (i24's scope)",
    "onceflow.broker.handlers.txn_markers": "the group commit's failures, keyed by local log",
    "onceflow.broker.log_cleaner": "the cleaner swaps cleaned segments into the local log",
    "onceflow.broker.server": "the group commit (one fsync for many local logs)",
    "onceflow.coordinator.coordinators": "the internal topics' local logs (i24's scope)",
    "onceflow.coordinator.internal_log": "the coordinators' log is a local log",
    "onceflow.metrics.snapshot": "size and offsets of each local log for the metrics",
    "onceflow.simulation.broker": "the simulation's crashes cut the local log (i24's scope)",
    "onceflow.simulation.checker": "the checker compares offsets of the local log",
}


@functools.cache
def _modules(root: Path) -> dict[str, ast.Module]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return found


def _inside_log(module: str, root: Path) -> bool:
    return module.split(".")[1:2] == ["log"] and module.split(".")[0] == root.name


def private_names_of_log(modules: dict[str, ast.Module], root: Path) -> set[str]:
    """The `_name`s the classes of log/ define: methods, and attributes set on `self`."""
    names: set[str] = set()
    for module, tree in modules.items():
        if not _inside_log(module, root):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
                    elif (
                        isinstance(item, ast.Attribute)
                        and isinstance(item.value, ast.Name)
                        and item.value.id == "self"
                    ):
                        names.add(item.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def private_uses(root: Path) -> list[str]:
    """`module:line expression` for each private part of log/ used outside it."""
    modules = _modules(root)
    private = private_names_of_log(modules, root)
    found = []
    for module, tree in modules.items():
        if _inside_log(module, root):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    return sorted(found)


def local_log_readers(root: Path) -> set[str]:
    """Modules outside log/ that read `x.log` of something other than themselves."""
    readers = set()
    for module, tree in _modules(root).items():
        if _inside_log(module, root):
            continue
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "log"
                and id(node) not in called
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                readers.add(module)
    return readers


def test_nothing_outside_log_uses_its_private_parts() -> None:
    found = private_uses(SRC)
    assert not found, "private parts of log/ used outside it: " + "; ".join(found)


def test_the_local_log_is_read_only_where_listed() -> None:
    new = sorted(local_log_readers(SRC) - set(KNOWN_LOCAL_LOG_READERS))
    assert not new, f"use UnifiedLog's public methods, not its local log (`.log`): {new}"


def test_known_local_log_readers_still_read_it() -> None:
    gone = sorted(set(KNOWN_LOCAL_LOG_READERS) - local_log_readers(SRC))
    assert not gone, f"no longer reads the local log, remove from KNOWN_LOCAL_LOG_READERS: {gone}"


# -- the checks bite ------------------------------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", "log/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


LOG_MODULE = (
    "class Local:\n"
    "    def __init__(self):\n"
    "        self._segments = []\n"
    "    def _abandon(self):\n"
    "        pass\n"
    "class Unified:\n"
    "    def __init__(self, local):\n"
    "        self.log = local\n"
    "    def abandon(self):\n"
    "        self.log._abandon()\n"
)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("def f(p):\n    p.log._abandon()\n", ["pkg.handler:2 p.log._abandon"]),
        ("def f(p):\n    return len(p._segments)\n", ["pkg.handler:2 p._segments"]),
        ("def f(p):\n    p.abandon()\n", []),
        ("class H:\n    def f(self):\n        return self._segments\n", []),
    ],
)
def test_a_private_use_is_found(tmp_path: Path, text: str, found: list[str]) -> None:
    root = _package(tmp_path, {"log/unified.py": LOG_MODULE, "handler.py": text})
    assert private_uses(root) == found


def test_a_local_log_reader_is_found(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "log/unified.py": LOG_MODULE,
            "handler.py": "def f(p):\n    return p.log.log_start_offset\n",
            "logs.py": "import logging\nlog = logging.getLogger()\nlog.log(10, 'x')\n",
        },
    )
    assert local_log_readers(root) == {"pkg.handler"}
