"""Benchmarks of onceflow against other Kafka-protocol brokers.

`onceflow bench` (throughput), `onceflow bench-eos` (what exactly-once costs) and
`onceflow bench-spark` (the bundled pipelines) are thin commands over these modules:
targets (brokers measured, started and supervised), producers and consumer (the
workloads), topics, stats (rounds, medians, ratios, latencies), render (tables), report
(JSON documents), throughput, eos and spark (the three benchmarks).
"""
