#!/bin/bash
# "No cost when unused": this tree's worker against another commit's (default
# main), alternating runs of `manage.py leasejobs_bench` on one database, so
# both see the same load. Usage:
#   LEASEJOBS_DB_NAME=lj_bench bench/queue_controls/compare.sh [REV] [ROUNDS]
# Prints each run and the medians. Deletes the jobs of that database.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
rev=${1:-main}
rounds=${2:-10}
other=$(mktemp -d)
trap 'rm -rf "$other"' EXIT
git -C "$here" archive "$rev" | tar -x -C "$other"
py="$here/.venv/bin/python"
args="--jobs 100000 --workers 2 --concurrency 4 --repeat 1 --enqueue-jobs 0 --latency-jobs 0 --worker-log-level warning"
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-demo_site.settings}
(cd "$here" && "$py" manage.py migrate -v 0)
for round in $(seq "$rounds"); do
  for side in "$other" "$here"; do
    figure=$(cd "$side" && "$py" manage.py leasejobs_bench $args 2>&1 | grep -o '[0-9,]* jobs/s' | head -1)
    name=$([ "$side" = "$here" ] && echo this || echo "$rev")
    echo "round $round $name $figure"
  done
done | tee /dev/stderr | "$py" -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    _, _, name, figure, _ = line.split()
    runs.setdefault(name, []).append(int(figure.replace(",", "")))
medians = {name: statistics.median(v) for name, v in runs.items()}
for name, median in medians.items():
    print(f"{name}: median {median:,.0f} jobs/s over {len(runs[name])} runs")
base, this = list(medians.values())
print(f"this / other: {this / base:.3f}")
'
