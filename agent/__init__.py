"""The debugagent agent: symptom parsing, the playbook engine, the LangGraph graph, the CLI."""

import time

__version__ = "0.1.0"
STARTED = time.monotonic()   # when this process began importing debugagent: the live view's elapsed time counts from here
