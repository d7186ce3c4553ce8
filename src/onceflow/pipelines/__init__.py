"""Bundled pipelines: `onceflow run NAME`, or `spark-submit` of a module's file on a cluster."""

# Test and demo hook: SIGKILL the driver right after the sink wrote this micro-batch and
# before Spark recorded it in the checkpoint's commit log (the classic duplicate-maker).
CRASH_AFTER_BATCH_ENV = "ONCEFLOW_CRASH_AFTER_BATCH"
