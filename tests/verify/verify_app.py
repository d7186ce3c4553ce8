"""`python -m tests.verify.verify_app verify ...`: the verify command in an app of its own,
for as long as `onceflow.cli.main` does not register it."""

from __future__ import annotations

import typer

from onceflow.cli.root_group import OnceflowGroup
from onceflow.cli.verify import verify_command

app = typer.Typer(cls=OnceflowGroup, add_completion=False, pretty_exceptions_enable=False)


@app.callback()
def main() -> None:
    """onceflow verify, standalone."""


app.command("verify")(verify_command)

if __name__ == "__main__":
    app()
