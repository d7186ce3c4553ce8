"""The C extension of onceflow; everything else is declared in pyproject.toml.

The record walker is required (no silent pure-Python fallback: it would cut Produce
throughput several times). `pip install -e .` builds it in place; so does
`python setup.py build_ext --inplace` with setuptools >= 77 (older ones cannot read
pyproject.toml's license field; there, compile it directly:
`gcc -O2 -fPIC -shared $(python3-config --includes) src/onceflow/records/_walker.c
-o src/onceflow/records/_walker$(python3-config --extension-suffix)`).
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
