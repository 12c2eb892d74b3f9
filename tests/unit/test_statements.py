"""Every statement leasejobs runs keeps its text byte for byte (issue 30).

The statements moved into ``leasejobs/db/sql/``, the shared fragments were
written once; the texts the database receives must not change. The snapshot
(``statements_before_issue30.json``) was taken from the code before the
move: each of its texts must still be found, and no other text. Four texts
in it were changed on purpose while the move was made (issue 28: a give-back
of an unstarted job undoes its claim, a queued job out of runs ends at the
claim, an admin release keeps its places); on 5 December the claims,
heartbeat, finish and release began writing their rows by ``ctid``. A text
changed on purpose is changed in the snapshot in the same commit
(``python tests/unit/statements.py`` writes it).
"""

import json

from tests.unit.statements import SNAPSHOT, collect


def test_every_statement_keeps_its_text_byte_for_byte():
    before = json.loads(SNAPSHOT.read_text())
    now = collect()
    lost = {where: text for where, text in before.items() if text not in set(now.values())}
    new = {where: text for where, text in now.items() if text not in set(before.values())}
    assert not lost, f"statements no longer found (changed or gone): {sorted(lost)}"
    assert not new, f"statements not in the snapshot: {sorted(new)}"
