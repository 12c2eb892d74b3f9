"""Every code block of README.md is run, so a README that drifts from the code fails here.

The unit tests check that each block says how it is run and that the
README's links lead somewhere. The integration test builds the README's
project (``django-admin startproject mysite``, its settings, its files) with
this checkout's venv on a database of its own, and runs every block in order:
shell commands, doctests and code in one shell session, settings variants
through ``manage.py check``, the systemd unit and the Kubernetes pod as their
supervisors would run them. ``pip`` lines and ``make demo`` need a fresh
virtualenv: tests/integration/test_quickstart.py runs them.
"""

import re
from pathlib import Path

import pytest

from tests import readme
from tests.helpers import ROOT

#: The Markdown files whose links are checked: the README and what it sends a newcomer to first.
LINKED = [
    "README.md",
    "CONTRIBUTING.md",
    "docs/tasks.md",
    "docs/operations.md",
    "docs/settings.md",
    "docs/worker.md",
]


def test_every_block_says_how_it_is_run():
    found = readme.blocks()
    unknown = [b.name for b in found if b.kind not in readme.KINDS or b.flags - readme.FLAGS]
    assert not unknown, f"blocks without a known kind ({sorted(readme.KINDS)}): {unknown}"
    kinds = {b.kind for b in found}
    assert kinds == readme.KINDS, f"kinds no block uses any more: {readme.KINDS - kinds}"


def test_the_quickstart_is_a_short_path_from_install_to_a_done_job():
    quickstart = [b for b in readme.blocks() if b.section == "Quickstart"]
    assert [b.kind for b in quickstart] == [
        "install",
        "settings",
        "settings",
        "file",
        "run",
        "pycon",
        "run",
        "pycon",
        "run",
    ]
    lines = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0].splitlines()
    assert len(lines) <= 75, len(lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, no punctuation but - and _, spaces as -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m[1]) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("name", LINKED)
def test_links_lead_to_files_and_headings_that_exist(name):
    path = ROOT / name
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in anchors(linked)):
            broken.append(target)
    assert not broken, broken
