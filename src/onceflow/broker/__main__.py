"""`python -m onceflow.broker ARGS` runs `onceflow broker ARGS`: what EmbeddedBroker starts.

kio registers hypothesis strategies for its types whenever hypothesis can be imported (a test
dependency, so in every development environment): about 0.15 s of CPU at each start of a
process that never generates test data. Tests start brokers by the hundred.
"""

import sys

sys.modules.setdefault("hypothesis", None)  # an import of it now fails: kio goes without

from onceflow.cli.main import app  # noqa: E402

app(["broker", *sys.argv[1:]], prog_name="onceflow")
