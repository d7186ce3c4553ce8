"""librdkafka's own log lines, kept out of the terminal.

They repeat what a client reports through its error callback, exceptions and delivery reports,
and a broker that is killed or restarted (the demo, verify) makes them noisy. Pass
`{"logger": QUIET}` in a client's configuration.
"""

from __future__ import annotations

import logging

QUIET = logging.getLogger("onceflow.librdkafka")
QUIET.addHandler(logging.NullHandler())
QUIET.propagate = False
