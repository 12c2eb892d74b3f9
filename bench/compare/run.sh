#!/usr/bin/env bash
# Compare leasejobs with PgQueuer and procrastinate on this machine, back to back.
#
#   DATABASE_URL=postgres://postgres:postgres@localhost:5432/leasejobs_bench bench/compare/run.sh [options]
#
# Makes bench/compare/.venv (Python 3.12+: $PYTHON, else python3.13 or python3.12 on PATH or under pyenv)
# with PgQueuer 1.6.x, procrastinate 3.10.x, asyncpg and uvloop from PyPI, then
# runs compare.py there; leasejobs itself runs from the project's .venv
# (make it first: make demo or make test). Options go to compare.py (--help).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ]; then
  python="${PYTHON:-}"
  if [ -z "$python" ]; then
    # On PATH, then under pyenv (whose shims exist for versions not selected, so each must run).
    root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    for candidate in python3.13 python3.12 python3 "$root"/versions/*/bin/python3.13 "$root"/versions/*/bin/python3.12; do
      if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import sys; sys.exit(sys.version_info < (3, 12))" 2>/dev/null; then
        python="$candidate"; break
      fi
    done
  fi
  if [ -z "$python" ]; then
    echo "no Python 3.12+ found; set PYTHON=/path/to/python3.12" >&2
    exit 1
  fi
  echo "==> creating $venv with $python ($("$python" -V 2>&1))" >&2
  "$python" -m venv "$venv"
fi
echo "==> installing PgQueuer 1.6.x and procrastinate 3.10.x into $venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "pgqueuer==1.6.*" "procrastinate==3.10.*" "asyncpg>=0.30" "uvloop>=0.21" "psycopg[binary]>=3.2"
exec "$venv/bin/python" "$here/compare.py" "$@"
