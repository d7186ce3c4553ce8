"""Build kio entities of any version from one superset of field values.

Handlers describe a response once, with every field the newest version has; `build` keeps the
fields the requested version's class declares, so every advertised version is answered from
the same code.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from functools import cache
from typing import Any


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def build(cls: type, **values: Any) -> Any:
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


def sibling(cls: type, name: str) -> type:
    """A nested entity class defined next to `cls` (same API and version)."""
    return getattr(sys.modules[cls.__module__], name)


def has_field(cls: type, name: str) -> bool:
    return name in _field_names(cls)
