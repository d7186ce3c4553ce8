"""The `onceflow` command: the broker, Kafka-user tools and the throughput benchmark."""

from __future__ import annotations

import typer

from onceflow.cli.acls import acls_app
from onceflow.cli.bench import bench_command
from onceflow.cli.bench_eos import bench_eos_command
from onceflow.cli.bench_spark import bench_spark_command
from onceflow.cli.broker import broker_command
from onceflow.cli.console import consume_command, produce_command
from onceflow.cli.demo import demo_command
from onceflow.cli.groups import groups_app
from onceflow.cli.root_group import OnceflowGroup
from onceflow.cli.run import run_command
from onceflow.cli.topics import topics_app
from onceflow.cli.transactions import transactions_app
from onceflow.cli.users import users_app
from onceflow.cli.verify import verify_command

app = typer.Typer(
    name="onceflow",
    cls=OnceflowGroup,
    help="Exactly-once event streaming: a Kafka-protocol broker and the tools to use it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("broker")(broker_command)
app.add_typer(topics_app, name="topics")
app.command("produce")(produce_command)
app.command("consume")(consume_command)
app.add_typer(groups_app, name="groups")
app.add_typer(transactions_app, name="transactions")
app.add_typer(users_app, name="users")
app.add_typer(acls_app, name="acls")
app.command("bench")(bench_command)
app.command("bench-eos")(bench_eos_command)
app.command("bench-spark")(bench_spark_command)
app.command("demo")(demo_command)
app.command("verify")(verify_command)
app.command(
    "run",
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],  # NAME --help is the pipeline's own help
    },
)(run_command)

if __name__ == "__main__":
    app()
