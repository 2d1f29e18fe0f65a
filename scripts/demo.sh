#!/usr/bin/env bash
# The README's first command: set up, generate the demo workload (once), run the pipeline until
# idle and print the summary. Running it again continues from the state in the data directory.
set -euo pipefail
cd "$(dirname "$0")/.."
data_dir=${1:-data}
bash scripts/setup.sh
if [ ! -f "$data_dir/gen_summary.json" ]; then
  .venv/bin/photon gen --data-dir "$data_dir" --queries 20000 --seed 42 --datacenters dc1
fi
exec .venv/bin/photon run --data-dir "$data_dir" --until-idle --json
