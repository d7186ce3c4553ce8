"""The import graph: no cycle between modules, and layers import downward only (README, "The
layers").

Every `import` of an onceflow module is an arrow, wherever it is written: at the top of a module,
inside a function, or under `if TYPE_CHECKING:` (a type named from a higher layer is still a
dependency on it, and it is how a `Broker` passed whole hides). An arrow goes to the module named,
or to the package when the name is not a module (`from onceflow.log import segment` is an arrow
to `onceflow.log.segment`).

Cycles: the strongly connected components of the module graph must all be single modules.

Layers: each module has the rank of the most specific entry of RANKS that names it or one of its
packages (`coordinator.schema` before `coordinator`); an arrow between two different entries must
go to a strictly lower rank. The `__main__` entry points are not imported by anything, so they may
import anything. KNOWN_UPWARD lists the arrows allowed to run back up, each with its reason; it is
empty, and a new one fails here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "onceflow"

# Bottom to top; one rank per line. A dotted entry ranks that module (or subpackage) apart from
# the rest of its package.
RANKS: list[list[str]] = [
    [
        "clock",
        "json_lines",
        "librdkafka_log",
        "kafka_errors",
        "fault_points",
        "rate_limited_log",
        "halt",
        "coordinator.schema",
        "coordinator.result",
    ],
    ["records", "security.scram"],
    ["protocol", "client_properties", "lazy_clients", "offset_lookup", "sql"],
    ["tools"],
    ["log"],
    ["txn"],
    ["compaction", "groups", "security"],
    ["coordinator"],
    ["metrics"],
    ["broker"],
    ["apache_kafka", "spark"],
    ["mirror"],
    ["pipelines"],
    ["verify", "simulation"],
    ["bench"],
    ["cli"],
]

# (importing module, imported module): why the arrow may run back up. Only shrinks.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def module_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at `root` (dotted, from the package's name) -> the modules of
    the same package it imports, anywhere in its text."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, node.module] if node.module else base)
                else:
                    source = node.module or ""
                for alias in node.names:
                    name = f"{source}.{alias.name}"
                    targets.add(name if name in modules else source)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def layer_of(module: str, ranks: list[list[str]]) -> tuple[str, int]:
    """The most specific RANKS entry naming `module` (without the top package), and its rank."""
    rank_of = {name: rank for rank, names in enumerate(ranks) for name in names}
    parts = module.split(".")[1:]
    for length in range(len(parts), 0, -1):
        entry = ".".join(parts[:length])
        if entry in rank_of:
            return entry, rank_of[entry]
    raise KeyError(module)


def upward_imports(
    graph: Mapping[str, Iterable[str]], ranks: list[list[str]]
) -> dict[tuple[str, str], str]:
    """(importer, imported) -> the two layers, for every arrow that does not go down."""
    upward: dict[tuple[str, str], str] = {}
    for importer, imported in sorted((a, b) for a, targets in graph.items() for b in targets):
        if importer.endswith(".__main__"):
            continue
        (its_layer, its_rank), (their_layer, their_rank) = (
            layer_of(importer, ranks),
            layer_of(imported, ranks),
        )
        if its_layer != their_layer and their_rank >= its_rank:
            upward[(importer, imported)] = (
                f"{its_layer} (rank {its_rank}) -> {their_layer} (rank {their_rank})"
            )
    return upward


GRAPH = module_graph(SRC)


def test_every_module_has_a_layer() -> None:
    missing = []
    for module in GRAPH:
        try:
            layer_of(module, RANKS)
        except KeyError:
            if module != "onceflow":
                missing.append(module)
    assert not missing, f"give these a rank in RANKS: {missing}"


def test_no_cycle_between_modules() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_only_the_command_line_sees_the_broker() -> None:
    """`Broker` is handed to nothing: the connection, the handlers (through their contexts),
    the coordinators and the log cleaner get narrow collaborators, so only what starts a broker
    imports broker/server.py."""
    importers = sorted(m for m, targets in GRAPH.items() if "onceflow.broker.server" in targets)
    assert importers == ["onceflow.cli.broker"]


def test_layers_import_downward_only() -> None:
    upward = upward_imports(GRAPH, RANKS)
    new = {pair: why for pair, why in upward.items() if pair not in KNOWN_UPWARD}
    assert not new, "upward imports: " + "; ".join(
        f"{a} -> {b} [{why}]" for (a, b), why in new.items()
    )


def test_known_upward_imports_still_exist() -> None:
    """The allowance only shrinks: one that is gone must leave KNOWN_UPWARD too."""
    gone = sorted(set(KNOWN_UPWARD) - set(upward_imports(GRAPH, RANKS)))
    assert not gone, f"no longer imported, remove from KNOWN_UPWARD: {gone}"


REPOSITORY = SRC.parent.parent
SCRIPT_FOLDERS = ("benchmarks", "fuzz")


def script_imports(path: Path) -> set[str]:
    """The top-level packages a script imports, anywhere in its text."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found


def scripts_importing_tests(root: Path) -> list[str]:
    """The scripts of benchmarks/ and fuzz/ under `root` that import the test suite: they run
    against public code only (what they need of their own is in benchmarks/_support.py)."""
    return sorted(
        str(path.relative_to(root))
        for folder in SCRIPT_FOLDERS
        for path in sorted((root / folder).rglob("*.py"))
        if "tests" in script_imports(path)
    )


def test_benchmarks_and_fuzzers_import_no_tests() -> None:
    assert (REPOSITORY / "benchmarks").is_dir() and (REPOSITORY / "fuzz").is_dir()
    found = scripts_importing_tests(REPOSITORY)
    assert not found, f"these import tests.*, move what they use to public code: {found}"


# -- the checks bite: a synthetic package with each fault ---------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        pytest.param(
            {"a.py": "from pkg.b import x\n", "b.py": "from pkg import a\nx = 1\n"},
            ["pkg.a", "pkg.b"],
            id="module level",
        ),
        pytest.param(
            {"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg.a import y\n"},
            ["pkg.a", "pkg.b"],
            id="inside a function",
        ),
        pytest.param(
            {
                "a.py": "import typing\nif typing.TYPE_CHECKING:\n    from .c import C\n",
                "b.py": "from . import a\n",
                "c.py": "from pkg.b import *\n",
            },
            ["pkg.a", "pkg.b", "pkg.c"],
            id="type checking, relative",
        ),
    ],
)
def test_a_cycle_is_found(tmp_path: Path, files: dict[str, str], cycle: list[str]) -> None:
    assert cycles(module_graph(_package(tmp_path, files))) == [cycle]


def test_no_cycle_in_a_chain(tmp_path: Path) -> None:
    root = _package(tmp_path, {"a.py": "import pkg.b\n", "b.py": "import pkg.c\n", "c.py": ""})
    assert cycles(module_graph(root)) == []


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    root = _package(
        tmp_path,
        {
            "low/__init__.py": "",
            "low/base.py": "def f():\n    from pkg.high import top\n",
            "low/detail.py": "",
            "high/__init__.py": "",
            "high/top.py": "from pkg.low import base\n",
        },
    )
    ranks = [["low.detail"], ["low"], ["high"]]
    assert set(upward_imports(module_graph(root), ranks)) == {("pkg.low.base", "pkg.high.top")}
    # the most specific entry ranks a module apart from its package: low.detail below low
    assert layer_of("pkg.low.detail", ranks) == ("low.detail", 0)
    assert layer_of("pkg.low.base", ranks) == ("low", 1)


@pytest.mark.parametrize(
    "text",
    [
        "from tests.confluent import create_topic\n",
        "def main():\n    import tests.spark.postgres\n",
        "import os, tests\n",
    ],
)
def test_a_script_importing_tests_is_found(tmp_path: Path, text: str) -> None:
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "fuzz" / "corpus").mkdir(parents=True)
    (tmp_path / "benchmarks" / "ok.py").write_text("from onceflow import clock\n")
    (tmp_path / "fuzz" / "corpus" / "bad.py").write_text(text)
    assert scripts_importing_tests(tmp_path) == ["fuzz/corpus/bad.py"]
