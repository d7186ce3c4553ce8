"""Mirror topics from one cluster to another, exactly once (KIP-656's design, on PySpark).

Topics of the source matching --topics (checked at every trigger: new topics and partitions
are picked up) are copied record for record: same partition number, key, value, headers and
timestamp (CreateTime kept), committed data only (read_committed). Target names follow
MirrorMaker 2's replication policies (`default`: `{alias}.{topic}`, `identity`: unchanged);
missing target topics are created with the source's partition count and topic configs, and
partitions added on the source are added on the target.

How exactly-once works across two clusters. A transaction lives in one cluster, so the
source's offsets cannot be committed in the target's transaction as a consumer group's would
be. As in MirrorMaker 2 since KIP-656, the *target* holds the source of truth: each write task
copies one source partition's range in one transaction on the target (transactional.id
`onceflow-mirror-{alias}.{target topic}.{partition}`, stable across runs, so a new attempt or
a new run fences the old one) and commits in the same transaction the next source offset to
copy, as the offset of group `onceflow-mirror-{alias}` for the target partition (Kafka refuses
offsets for partitions the cluster lacks, and the source topic is not in the target). After
fencing, the task reads that position and skips the rows below it. The Spark checkpoint only
speeds things up: without one the source starts each partition at the target's position, and
the first micro-batch plan of every run rewinds to it, so deleting the checkpoint directory
loses nothing and repeats nothing.

The sink's done-marks (onceflow.spark.task_transaction) are not used: a mark is a (Spark batch
id, rows) position that means something only with the checkpoint that numbered the batches; a
new checkpoint restarts batch ids at 0, and the marks would then skip or repeat records. The
mirror's position is a source offset, meaningful in any run. Both are the same mechanism (a
transactional group offset committed with the data, read after fencing), and the mirror reuses
its pieces (the fencing producer, the read_committed offset read); they never share a group.

Source and target are told apart by cluster id: one cluster with the identity policy would
copy every topic onto itself without end, and is refused before Spark starts; with the
default policy the mirror's own copies (`{alias}.X`) are left out, as MirrorMaker 2 does. A
record too large for the target topic stops the mirror right before it, with one line.

With --groups, the driver also translates consumer groups' offsets (onceflow.mirror.group_sync,
through the offset syncs each transaction writes: onceflow.mirror.offset_syncs), so that an
application can fail over from the source to the target and resume where it stood.

Run it with `onceflow run mirror ...`, `python -m onceflow.pipelines.mirror ...`, or
`spark-submit .../onceflow/pipelines/mirror.py ...` on a cluster.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from onceflow.librdkafka_log import QUIET
from onceflow.mirror.data_source import TARGET_PREFIX, MirrorDataSource, mirror_target
from onceflow.mirror.group_sync import GroupsPatternError, GroupSync, GroupSyncError, groups_pattern
from onceflow.mirror.offset_sync_store import OffsetSyncReadError
from onceflow.mirror.positions import MirrorPositions
from onceflow.mirror.progress import MirrorProgress
from onceflow.mirror.replication_policy import (
    POLICIES,
    ReplicationPolicy,
    ReplicationPolicyError,
    subscription_pattern,
)
from onceflow.mirror.target_limit import RecordTooLargeError
from onceflow.pipelines.checkpoint import clear_unfinished_first_batch
from onceflow.pipelines.session import client_properties_file, run_until, session
from onceflow.spark.options import SourceOptions
from onceflow.spark.topic_offsets import TopicOffsets
from onceflow.tools.errors import UsageError
from onceflow.tools.option_values import parse_pairs

_INTERVAL = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min)?\s*")
_MS = {"ms": 1, "s": 1000, None: 1000, "m": 60_000, "min": 60_000}


# A reason the mirror stops, as the last line of the Python traceback that Spark's error carries
_STOPPED_BY = re.compile(
    rf"^{re.escape(RecordTooLargeError.__module__)}\.{RecordTooLargeError.__qualname__}: (.+)$",
    re.MULTILINE,
)


class MirrorArgumentError(ValueError):
    """A --trigger-interval or --sync-group-offsets-interval the mirror cannot use."""


def trigger_ms(text: str, flag: str = "--trigger-interval") -> int:
    """'1s', '500ms', '2m' (or plain seconds) as milliseconds."""
    match = _INTERVAL.fullmatch(text)
    if not match:
        raise MirrorArgumentError(f"{flag} {text!r}: want e.g. 500ms, 1s, 2m")
    return int(float(match.group(1)) * _MS[match.group(2)])


def mirror_options(
    *,
    source: str,
    target: str,
    topics: str,
    policy: str = "default",
    alias: str = "source",
    max_offsets_per_trigger: int | None = None,
    source_properties: dict[str, str] | None = None,
    target_properties: dict[str, str] | None = None,
    exactly_once: bool = True,
    same_cluster: bool = False,
) -> dict[str, str]:
    """The `onceflow-mirror` options, for its reader and its writer alike. On `same_cluster`
    the topics the mirror itself made (`{alias}.X`, down the chain) are left out."""
    ReplicationPolicy(policy, alias)  # fail here, on the driver, with the flag's name
    options = {
        **{f"kafka.{k}": v for k, v in (source_properties or {}).items()},
        "kafka.bootstrap.servers": source,
        **{f"{TARGET_PREFIX}{k}": v for k, v in (target_properties or {}).items()},
        f"{TARGET_PREFIX}bootstrap.servers": target,
        "subscribePattern": subscription_pattern(topics, alias if same_cluster else None),
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
        "mirror.alias": alias,
        "mirror.replicationPolicy": policy,
        "exactlyOnce": str(exactly_once).lower(),
    }
    if max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    return options


def start(
    spark: SparkSession,
    *,
    checkpoint: str,
    trigger_interval: str | None = None,
    **mirror: object,
) -> StreamingQuery:
    """Start the mirror query (`mirror` are mirror_options' keywords; without `same_cluster`,
    the two clusters are asked: MirrorLoopError for a mirror that would never end,
    ConnectionError for a cluster that does not answer)."""
    if "same_cluster" not in mirror:
        mirror["same_cluster"] = same_cluster(**mirror)  # type: ignore[arg-type]
    options = mirror_options(**mirror)  # type: ignore[arg-type]
    spark.dataSource.register(MirrorDataSource)
    writer = (
        spark.readStream.format(MirrorDataSource.name())
        .options(**options)
        .load()
        .writeStream.format(MirrorDataSource.name())
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .queryName(f"mirror-{mirror.get('alias', 'source')}")
    )
    if trigger_interval:
        writer = writer.trigger(processingTime=f"{trigger_ms(trigger_interval)} milliseconds")
    clear_unfinished_first_batch(checkpoint)
    return writer.start()


def group_sync(
    *,
    source: str,
    target: str,
    topics: str,
    groups: str,
    policy: str = "default",
    alias: str = "source",
    source_properties: dict[str, str] | None = None,
    target_properties: dict[str, str] | None = None,
    same_cluster: bool = False,
    **_ignored: object,
) -> GroupSync:
    """The driver's group translation for the mirror of these options (mirror_options')."""
    return GroupSync(
        source_client={**(source_properties or {}), "bootstrap.servers": source},
        target_client={**(target_properties or {}), "bootstrap.servers": target},
        policy=ReplicationPolicy(policy, alias),
        topics=subscription_pattern(topics, alias if same_cluster else None),
        groups=groups,
    )


def sync_groups(sync: GroupSync) -> str:
    """One translation pass, as a progress line (a cluster away: said, tried again later)."""
    try:
        return sync.sync().line()
    except (GroupSyncError, OffsetSyncReadError, KafkaException) as exc:
        return f"mirror: groups: not synced this time ({exc})"


class MirrorLoopError(ValueError):
    """Source and target are one cluster, and the mirror would copy its own output for ever."""


def cluster_id(name: str, bootstrap: str, client: dict[str, str], timeout: float) -> str | None:
    """The cluster's id (None from a broker too old to say), from one metadata request: a
    wrong address fails here in one line, before Spark starts."""
    admin = AdminClient({**client, "bootstrap.servers": bootstrap, "logger": QUIET})
    try:
        return admin.list_topics(timeout=timeout).cluster_id or None
    except KafkaException as exc:
        raise ConnectionError(
            f"the {name} cluster at {bootstrap} is unreachable ({exc.args[0].str()})"
        ) from None


def same_cluster(
    *,
    source: str,
    target: str,
    policy: str = "default",
    alias: str = "source",
    source_properties: dict[str, str] | None = None,
    target_properties: dict[str, str] | None = None,
    timeout: float = 10.0,
    **_ignored: object,
) -> bool:
    """Whether source and target are one cluster (same cluster id, however addressed; or the
    same address). There the identity policy would copy every topic onto itself, its copies
    included, without end: MirrorLoopError. The default policy's copies are `{alias}.X`, which
    the mirror then leaves out (MirrorMaker 2's cycle detection)."""
    source_id = cluster_id("source", source, source_properties or {}, timeout)
    target_id = cluster_id("target", target, target_properties or {}, timeout)
    if source_id is None or target_id is None:  # no id to compare: addresses only
        one = source.strip().lower() == target.strip().lower()
    else:
        one = source_id == target_id
    if one and policy == "identity":
        raise MirrorLoopError(
            f"the source and target are the same cluster (cluster id {source_id}): "
            "--replication-policy identity would mirror every topic onto itself without end"
        )
    return one


def stopped_by(exc: BaseException) -> str | None:
    """The one line saying why the mirror stopped (a record too large for the target), out of
    the query's error that carries it in a task's or the driver's traceback; None if none."""
    match = _STOPPED_BY.search(str(exc))
    return match.group(1).strip() if match else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mirror", description=__doc__.splitlines()[0])
    p.add_argument("--source-bootstrap-server", required=True)
    p.add_argument("--target-bootstrap-server", required=True)
    p.add_argument("--topics", required=True, help="Regex of source topics (matched whole).")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory.")
    p.add_argument("--replication-policy", choices=POLICIES, default="default")
    p.add_argument("--source-alias", default="source")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--trigger-interval", default=None, help="e.g. 1s, 500ms [as fast as it can]")
    p.add_argument("--source-property", action="append", default=[], metavar="K=V")
    p.add_argument("--target-property", action="append", default=[], metavar="K=V")
    for side in ("source", "target"):
        p.add_argument(
            f"--{side}-command-config",
            type=client_properties_file,
            default={},
            metavar="FILE",
            help=f"Client settings for the {side} cluster, a Kafka properties file "
            f"(--{side}-property settings override it).",
        )
    p.add_argument(
        "--at-least-once", action="store_true", help="Plain producer, no positions: to compare."
    )
    p.add_argument("--progress-interval", type=float, default=10.0, help="Seconds [10].")
    p.add_argument(
        "--groups",
        default=None,
        metavar="REGEX",
        help="Source consumer groups (matched whole) whose offsets are translated to the target.",
    )
    p.add_argument(
        "--sync-group-offsets-interval",
        default="5s",
        help="How often --groups are translated, e.g. 5s, 1m [5s].",
    )
    p.add_argument(
        "--until-caught-up", action="store_true", help="Stop once every record is mirrored."
    )
    p.add_argument("--master", default=None, help="Spark master [local[2,4]].")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    try:
        source_props = {
            **args.source_command_config,
            **parse_pairs(args.source_property, "--source-property"),
        }
        target_props = {
            **args.target_command_config,
            **parse_pairs(args.target_property, "--target-property"),
        }
        mirror = dict(
            source=args.source_bootstrap_server,
            target=args.target_bootstrap_server,
            topics=args.topics,
            policy=args.replication_policy,
            alias=args.source_alias,
            max_offsets_per_trigger=args.max_offsets_per_trigger,
            source_properties=source_props,
            target_properties=target_props,
            exactly_once=not args.at_least_once,
        )
        mirror_options(**mirror)  # checks --topics and the policy before any request
        if args.trigger_interval:
            trigger_ms(args.trigger_interval)
        sync_every = args.sync_group_offsets_interval
        sync_every_s = trigger_ms(sync_every, "--sync-group-offsets-interval") / 1000.0
        if args.groups is not None:
            groups_pattern(args.groups)
            if args.at_least_once:
                raise UsageError("--groups needs the exactly-once mirror (its offset syncs)")
    except (MirrorArgumentError, ReplicationPolicyError, UsageError, GroupsPatternError) as exc:
        p.error(str(exc))
    try:
        mirror["same_cluster"] = same_cluster(**mirror)  # type: ignore[arg-type]
    except ConnectionError as exc:
        print(f"mirror: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except MirrorLoopError as exc:  # the options are wrong: a usage error's status, one line
        print(f"mirror: error: {exc}", file=sys.stderr)
        sys.exit(2)
    if mirror["same_cluster"]:
        print(
            f"mirror: the source and target are the same cluster: topics named "
            f"{args.source_alias}.* (the mirror's own copies) are not mirrored",
            file=sys.stderr,
        )
    options = mirror_options(**mirror)  # type: ignore[arg-type]
    spark = session(f"onceflow-mirror-{args.source_alias}", args.master)
    try:
        _run(spark, args, mirror, options, sync_every_s)
    except StreamingQueryException as exc:
        reason = stopped_by(exc)
        if reason is None:
            raise
        print(f"mirror: error: {reason}", file=sys.stderr)
        sys.exit(1)


def _run(
    spark: SparkSession,
    args: argparse.Namespace,
    mirror: dict[str, object],
    options: dict[str, str],
    sync_every_s: float,
) -> None:
    """Start the mirror and run it: to the end with --until-caught-up, else for good, with
    progress lines and the groups' translation."""
    query = start(
        spark, checkpoint=args.checkpoint, trigger_interval=args.trigger_interval, **mirror
    )
    groups = group_sync(groups=args.groups, **mirror) if args.groups is not None else None
    if args.until_caught_up:
        run_until(query, True)
        if groups is not None:  # everything is mirrored now: every group translates
            print(sync_groups(groups), flush=True)
            groups.close()
        return
    target = mirror_target(options)
    progress = MirrorProgress(
        TopicOffsets(SourceOptions.parse(options, streaming=True)),
        MirrorPositions(target.client, target.policy, target.timeout_s)
        if target.exactly_once
        else None,
    )
    due = {"progress": time.monotonic() + args.progress_interval, "groups": time.monotonic()}
    wake = args.progress_interval if groups is None else min(args.progress_interval, sync_every_s)
    said = ""  # the last group line: printed again only when it changes
    try:
        while not query.awaitTermination(wake):
            now = time.monotonic()
            if now >= due["progress"]:
                print(progress.line(query.recentProgress), flush=True)
                due["progress"] = now + args.progress_interval
            if groups is not None and now >= due["groups"]:
                line = sync_groups(groups)
                if line != said:
                    print(line, flush=True)
                    said = line
                due["groups"] = now + sync_every_s
    finally:
        if groups is not None:
            groups.close()


if __name__ == "__main__":
    main()
