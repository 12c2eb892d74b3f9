"""Start a PgQueuer worker as ``pgq run`` does (``pgqueuer.run`` on uvloop).

``pgq run`` of PgQueuer 1.6.0 stops at start-up with the typer that pip
installs next to it (its --log-level parser hands a str where an Enum is
expected), as the project's peer benchmark found; this calls the same
function the CLI command calls, with the same defaults.
"""

import argparse
import logging
from datetime import timedelta

import uvloop
from pgqueuer import run
from pgqueuer.adapters.cli import factories
from pgqueuer.types import QueueExecutionMode

parser = argparse.ArgumentParser()
parser.add_argument("factory")
parser.add_argument("--batch-size", type=int, default=10)
parser.add_argument("--mode", choices=["continuous", "drain"], default="continuous")
parser.add_argument("--max-concurrent-tasks", type=int, default=None, help="(pgq run's option of that name)")
args = parser.parse_args()
logging.basicConfig(level=logging.WARNING)
worker = run(
    factories.load_factory(args.factory),
    batch_size=args.batch_size,
    mode=QueueExecutionMode(args.mode),
    max_concurrent_tasks=args.max_concurrent_tasks,
    dequeue_timeout=timedelta(seconds=30),
)
uvloop.run(worker)
