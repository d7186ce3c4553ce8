"""The import graph: layers import downward only (DESIGN.md, section 1).

Each package (or top-level module) of `onceflow` has a rank; a module may import its own
package and anything of a lower rank. Imports under `if TYPE_CHECKING:` and the `__main__`
entry points are not dependencies. The upward imports that exist today are listed with the
reason they stay, so that a new one fails here and the list can only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "onceflow"

# Bottom to top; one rank per line.
RANKS = [
    ["clock", "json_lines", "coordinator_schema", "librdkafka_log", "kafka_errors"],
    ["records"],
    ["protocol", "client_properties", "lazy_clients", "offset_lookup", "sql"],
    ["log", "coordinator_result"],
    ["txn"],
    ["compaction", "groups", "security"],
    ["coordinator_runtime"],
    ["broker"],
    ["apache_kafka", "spark"],
    ["mirror"],
    ["pipelines"],
    ["verify", "simulation"],
    ["bench"],
    ["cli"],
]
RANK = {name: rank for rank, names in enumerate(RANKS) for name in names}

# (importer's package, imported package): why it is still there.
KNOWN_UPWARD = {
    ("protocol", "security"): "the protocol client's SASL uses security.scram (pure functions)",
    ("coordinator_result", "txn"): "TopicPartition lives in txn.transaction_log",
    ("coordinator_runtime", "broker"): "fault points and the rate-limited log live in broker",
    ("bench", "cli"): "the benchmarks print and fail through the CLI's output and errors",
    ("pipelines", "cli"): "the mirror's options are parsed with the CLI's helpers",
}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(path: Path) -> set[str]:
    """The onceflow packages `path` imports at run time."""
    module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = [target]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(_package(name) for name in names if name.startswith("onceflow."))
    return found


def _upward_imports() -> dict[tuple[str, str], list[str]]:
    upward: dict[tuple[str, str], list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        importer = _package(".".join(path.relative_to(SRC.parent).with_suffix("").parts))
        for imported in _imports(path):
            if imported != importer and RANK[imported] >= RANK[importer]:
                upward.setdefault((importer, imported), []).append(str(path.relative_to(SRC)))
    return upward


def test_every_package_has_a_rank() -> None:
    packages = {p.stem if p.is_file() else p.name for p in SRC.iterdir()}
    packages -= {"__init__", "__pycache__", "py"}
    missing = sorted(p for p in packages if not p.startswith(".") and p not in RANK)
    assert not missing, f"give these a rank in RANKS: {missing}"


def test_layers_import_downward_only() -> None:
    upward = _upward_imports()
    new = {pair: files for pair, files in upward.items() if pair not in KNOWN_UPWARD}
    assert not new, "upward imports: " + "; ".join(
        f"{a} -> {b} ({', '.join(files)})" for (a, b), files in sorted(new.items())
    )


def test_known_upward_imports_still_exist() -> None:
    """The allowance only shrinks: one that is gone must leave KNOWN_UPWARD too."""
    gone = sorted(set(KNOWN_UPWARD) - set(_upward_imports()))
    assert not gone, f"no longer imported, remove from KNOWN_UPWARD: {gone}"
