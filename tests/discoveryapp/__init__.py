"""An installed app whose tasks sit where a project puts them: what ``enqueue`` must find or refuse.

``tasks/`` is a package that imports ``emails`` and ``shared`` (which
imports ``deeper``); ``tasks/unimported.py`` and ``elsewhere.py`` are
imported by no tasks module, so no worker would run their tasks;
``models.py`` is imported while Django sets up, in workers too.
tests/unit/test_refusals.py imports them in different orders, each in a process
of its own.
"""
