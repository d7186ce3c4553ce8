"""Exactly-once mirroring between clusters (KIP-656's design on PySpark): `onceflow run mirror`.

The pipeline's docstring (`onceflow.pipelines.mirror`) tells how the pieces fit together.
"""
