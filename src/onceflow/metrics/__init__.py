"""Prometheus metrics of the broker, named as Kafka operators already graph them.

`request_counters` holds what the hot path bumps (plain ints, once per request or batch);
`collector` turns those and the broker's state (read at scrape time) into metric families;
`endpoint` serves them over HTTP on the broker's own event loop (`metrics.listen`).
"""
