"""onceflow: exactly-once event streaming for Python and Spark."""

__version__ = "0.1.0"
