"""The C extension of onceflow; everything else is declared in pyproject.toml.

The record walker is required (no silent pure-Python fallback: it would cut Produce
throughput several times). Build it in place with `python setup.py build_ext --inplace`.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "onceflow.records._walker",
            sources=["src/onceflow/records/_walker.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=False,
        )
    ],
)
