"""Kafka's coordinator runtime, shared by the transaction and group coordinators.

Layered inside: `schema` (the records' framing) and `result` (what a coordinator returns) are
below the coordinators (txn/, groups/), which build on them; `runtime` (the one driver, sans-IO),
`internal_log` (a coordinator's own log) and `coordinators` (both coordinators at work in the
asyncio broker) are above them and below the broker.
"""
