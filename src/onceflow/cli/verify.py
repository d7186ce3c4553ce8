"""`onceflow verify`: a Jepsen-style workload, fault injector and checker for exactly-once."""

from __future__ import annotations

import json
import re
import secrets
import sys
from pathlib import Path
from typing import Annotated

import typer

from onceflow.tools.clients import parse_bootstrap
from onceflow.tools.errors import CliError, UsageError
from onceflow.tools.output import stderr_console, stdout_console

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
PROGRESS_EVERY_S = 5.0


def parse_duration(text: str) -> float:
    """`90`, `90s`, `10m`, `1.5h`, `500ms` to seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise UsageError(f"Invalid duration '{text}': expected e.g. 60s, 10m or 1h.")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_settings(items: list[str]) -> dict[str, str]:
    """`-o key=value` items to settings (the last of a key wins)."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"Invalid --override '{item}': expected KEY=VALUE.")
        settings[key.strip()] = value.strip()
    return settings


def verify_command(
    bootstrap_server: Annotated[
        str | None,
        typer.Option(
            "--bootstrap-server",
            "-b",
            metavar="HOST:PORT",
            help="Verify this Kafka cluster (onceflow's or any other). Only the client-side "
            "faults apply: pause (of clients), crash-client and partition.",
        ),
    ] = None,
    apache_kafka: Annotated[
        str | None,
        typer.Option(
            "--apache-kafka",
            metavar="DIR",
            help="Start an Apache Kafka cluster on loopback (KRaft, --nodes nodes, replication "
            "3 (or fewer nodes), min.insync.replicas=2, no unclean election) and verify it; "
            "DIR is a Kafka binary "
            "distribution (the unpacked kafka_2.13-4.x.y/) or its libs/ folder, or 'fetched' "
            "for the release onceflow pins, fetched once with Maven into "
            "~/.cache/onceflow/apache-kafka. kill, pause and partition (the node cut off from "
            "every client) strike one node at a time: the leader of a workload partition, the "
            "transaction coordinator of a producer or copier, the copiers' group coordinator, "
            "or any node; disk does not apply to Kafka.",
        ),
    ] = None,
    nodes: Annotated[
        int,
        typer.Option("--nodes", min=1, help="With --apache-kafka: how many nodes."),
    ] = 3,
    override: Annotated[
        list[str] | None,
        typer.Option(
            "--override",
            "-o",
            metavar="KEY=VALUE",
            help="With --apache-kafka: a setting of every node over the exactly-once ones "
            "(unclean.leader.election.enable=true); repeatable.",
        ),
    ] = None,
    embedded: Annotated[
        bool,
        typer.Option(
            "--embedded",
            help="Start onceflow's broker as a child process (in the work directory) and "
            "verify it; every fault applies.",
        ),
    ] = False,
    mirror: Annotated[
        bool,
        typer.Option(
            "--mirror",
            help="With --embedded: start a second (target) broker and the mirror pipeline "
            "(onceflow run mirror) from the workload's topics to it; kill kills either broker, "
            "kill-mirror (in all) kills the mirror's driver; at the end the target, read "
            "read_committed, must hold every committed source record once, in order.",
        ),
    ] = False,
    duration: Annotated[
        str, typer.Option("--duration", "-d", help="How long the workload runs: 60s, 10m, 1h.")
    ] = "60s",
    faults: Annotated[
        str,
        typer.Option(
            "--faults",
            "-f",
            help="Comma-separated faults, mixed at random: kill (SIGKILL of the broker, or of "
            "an Apache Kafka node, and restart), pause (SIGSTOP/SIGCONT of the broker, a node "
            "or a client), partition (a proxy cuts, delays or black-holes client connections "
            "to every node), crash-client (SIGKILL of a client mid-transaction), disk (the "
            "embedded broker's filesystem full; needs root to mount a small tmpfs, simulated "
            "without; not with --apache-kafka), kill-mirror (SIGKILL of the mirror's driver, "
            "with --mirror), lagging-failover (--apache-kafka: a partition's leader cut off "
            "from the other nodes until alone in its ISR, then SIGKILLed and restarted once "
            "another leader is elected; in all there); or all, or none.",
        ),
    ] = "all",
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Seed of the fault schedule and the workload [random]."),
    ] = None,
    json_file: Annotated[
        Path | None,
        typer.Option(
            "--json",
            metavar="FILE",
            help="Write the JSON report (every anomaly) here; - for stdout.",
        ),
    ] = None,
    report_dir: Annotated[
        Path | None,
        typer.Option(
            "--report",
            metavar="DIR",
            help="Write an HTML report here (DIR/index.html, self-contained): committed "
            "transactions per second and end-to-end latency over time, each fault shaded, "
            "broker halts and restarts, anomalies where they happened, the checker's tables "
            "and the command that reproduces the run; DIR/timeline.json holds its figures.",
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            help="Keep the history (history.jsonl), the logs and the broker's data here "
            "[a temporary directory, kept only when anomalies are found].",
        ),
    ] = None,
    producers: Annotated[
        int, typer.Option("--producers", min=1, help="Transactional producers.")
    ] = 3,
    copiers: Annotated[
        int,
        typer.Option("--copiers", min=0, help="Consume-transform-produce copiers (one group)."),
    ] = 2,
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            "-w",
            help="default: transactional producers and copiers over plain topics; "
            "compacted: keyed transactional producers (a small key space, tombstones, aborts) "
            "on a compacted topic with tiny segments and an eager cleaner, checked for the "
            "last committed value of every key, no aborted value after cleaning and no "
            "offset changed; "
            "database: loaders instead of copiers, consumers (onceflow.sql's DatabaseConsumer, "
            "read_committed) that store the input into a SQL table, rows and positions in one "
            "database transaction, killed mid-transaction by crash-client; the table is checked "
            "to equal the committed input exactly (none lost, none twice, nothing aborted).",
        ),
    ] = "default",
    sink_url: Annotated[
        str | None,
        typer.Option(
            "--sink-url",
            metavar="URL",
            help="With --workload database: the database, postgresql://USER@HOST:PORT/DB or "
            "sqlite:///FILE [an SQLite file in the work directory].",
        ),
    ] = None,
    postgres: Annotated[
        bool,
        typer.Option(
            "--postgres",
            help="With --workload database: start a PostgreSQL server of the distribution's "
            "packages (initdb and postgres, /usr/lib/postgresql/*/bin or PATH) for the run, "
            "on a free port in a temporary directory, as the database; kill then SIGKILLs it "
            "(postmaster and backends) or the broker, at random, and restarts it.",
        ),
    ] = False,
    transaction_timeout_ms: Annotated[
        int,
        typer.Option(
            "--transaction-timeout-ms",
            min=1000,
            help="The clients' transaction.timeout.ms; pauses and partitions are held for "
            "about 0.2 to 1.5 times it, so that some trip it.",
        ),
    ] = 10_000,
    group_protocol: Annotated[
        str,
        typer.Option(
            "--group-protocol",
            help="The copiers' group.protocol: classic, or consumer (KIP-848).",
        ),
    ] = "classic",
    client: Annotated[
        str,
        typer.Option(
            "--client",
            help="The producers' and copiers' client: python (confluent-kafka, librdkafka: "
            "transactions version 1) or java (Kafka's Java client of the release onceflow "
            "pins, fetched once with Maven as --apache-kafka fetched; transactions version 2 "
            "where the broker finalizes it); the readers are Python either way.",
        ),
    ] = "python",
) -> None:
    """Prove exactly-once under faults: transactional producers, consume-transform-produce
    copiers and read_committed / read_uncommitted consumers run while faults are injected;
    then a checker looks for aborted reads, lost writes, duplicates, inconsistent offsets,
    non-monotonic or skipping polls, torn transactions and offsets committed by aborted
    transactions. Exits 1 if it finds any. With --apache-kafka it is a Jepsen-style check of
    Apache Kafka itself: the run starts the cluster and kills, pauses and isolates its nodes,
    and strands a leader alone in its ISR before it fails over."""
    # Imported here so that the other commands start without loading the harness.
    from onceflow.verify.faults import parse_faults
    from onceflow.verify.harness import Progress, VerifyError, VerifyOptions, run_verify
    from onceflow.verify.report import (
        anomalies_table,
        examples_table,
        faults_table,
        operations_table,
        report_json,
        summary,
        write_json,
    )

    if mirror and not embedded:
        raise UsageError("--mirror needs --embedded (it starts both brokers).")
    if [embedded, bootstrap_server is not None, apache_kafka is not None].count(True) != 1:
        raise UsageError(
            "Choose one target: --embedded, --apache-kafka DIR or --bootstrap-server HOST:PORT."
        )
    if apache_kafka is None and (override or nodes != 3):
        raise UsageError("--nodes and --override need --apache-kafka.")
    if group_protocol not in ("classic", "consumer"):
        raise UsageError(f"--group-protocol must be classic or consumer, not {group_protocol!r}.")
    if client not in ("python", "java"):
        raise UsageError(f"--client must be python or java, not {client!r}.")
    settings = parse_settings(override or [])
    try:
        kinds = parse_faults(faults, mirror, apache_kafka is not None)
    except ValueError as e:
        raise UsageError(f"Invalid --faults: {e}.") from None
    if workload not in ("default", "compacted", "database"):
        raise UsageError(f"Invalid --workload '{workload}': default, compacted or database.")
    if (sink_url is not None or postgres) and workload != "database":
        raise UsageError("--sink-url and --postgres need --workload database.")
    if sink_url is not None and postgres:
        raise UsageError("--sink-url or --postgres, not both.")
    options = VerifyOptions(
        duration_s=parse_duration(duration),
        faults=kinds,
        seed=secrets.randbelow(1 << 31) if seed is None else seed,
        bootstrap=parse_bootstrap(bootstrap_server) if bootstrap_server else None,
        apache_kafka=apache_kafka,
        nodes=nodes,
        kafka_settings=tuple(settings.items()),
        work_dir=work_dir,
        producers=producers,
        copiers=copiers,
        transaction_timeout_ms=transaction_timeout_ms,
        group_protocol=group_protocol,
        workload=workload,
        mirror=mirror,
        sink_url=sink_url,
        postgres=postgres,
        client=client,
    )
    err = stderr_console()
    target = "the embedded broker" if options.embedded else options.bootstrap
    if apache_kafka is not None:
        shown = "".join(f", {k}={v}" for k, v in settings.items())
        target = f"Apache Kafka ({apache_kafka}), {nodes} nodes{shown}"
    if mirror:
        target = "the embedded broker mirrored to a second one"
    err.print(
        f"onceflow verify: {target}, {options.duration_s:g} s, faults "
        f"{','.join(kinds) or 'none'}, seed {options.seed}, workload {workload}"
        + (f", {client} client" if client != "python" else "")
    )
    last = {"phase": "", "at": -PROGRESS_EVERY_S}

    def progress(p: Progress) -> None:
        if p.phase == last["phase"] and p.elapsed_s - last["at"] < PROGRESS_EVERY_S:
            return
        last["phase"], last["at"] = p.phase, p.elapsed_s
        if p.phase != "running":
            err.print(f"[{p.elapsed_s:6.1f}s] {p.phase}")
            return
        fault = f", now: {p.current_fault}" if p.current_fault else ""
        err.print(
            f"[{p.elapsed_s:6.1f}s] txns committed {p.committed}, aborted {p.aborted}, "
            f"unknown {p.unknown}; records read {p.records_read}; faults {p.faults}{fault}"
        )

    try:
        run = run_verify(options, progress)
    except VerifyError as e:
        raise CliError(str(e)) from None
    out = stdout_console()
    out.print(operations_table(run))
    out.print(faults_table(run))
    out.print(anomalies_table(run))
    examples = examples_table(run)
    if examples is not None:
        out.print(examples)
    for note in run.notes:
        err.print(f"note: {note}")
    for error in run.errors:
        err.print(f"error: {error}")
    if json_file is not None and str(json_file) == "-":
        print(json.dumps(report_json(run), indent=2, default=str))
    else:
        if json_file is not None:
            write_json(run, json_file)
        print(json.dumps(summary(run), default=str))
    if report_dir is not None:
        from onceflow.verify.html_report import write_report

        err.print(f"report: {write_report(run, report_dir)}")
    if run.work_dir.exists():
        err.print(f"history and logs: {run.work_dir}")
    java = run.details.get("java_client")
    if java is not None and "epochs" in java:
        version = "version 2" if java["version_2"] else "NOT version 2"
        err.print(
            f"Java client {java['kafka']}: transactions {version} (epoch per writer "
            f"{java['epochs']}, transactions ended {java['ended_transactions']})"
        )
    if "check_s" in run.details:
        err.print(
            f"run {run.details['run_s']:.1f} s, checked in {run.details['check_s']:.1f} s "
            f"({run.result.stats['operations']} operations)"
        )
    verdict = "no anomalies" if run.result.valid else f"{len(run.result.anomalies)} anomalies"
    err.print(f"onceflow verify: {verdict}" + (" (run errors)" if run.errors else ""))
    sys.stdout.flush()
    if not run.ok:
        raise typer.Exit(code=1)
