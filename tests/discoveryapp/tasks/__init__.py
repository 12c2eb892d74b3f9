"""The app's tasks module, a package: what it imports is what a worker registers."""

import tests.discoveryapp.shared  # noqa: F401  (its tasks)

from . import emails  # noqa: F401  (its tasks)
