#!/usr/bin/env bash
# The README's second command: set up, then run the whole test suite (extra pytest args pass through).
# `--quick`: only the quick tier (tests/conftest.py: QUICK), under three minutes, for use while working;
# on two workers too (one process took 3 min 4 s at `d891f6f`: a Spark session and photon CLI processes).
# The full suite runs on two workers (pytest-xdist), a test module at a time (its module fixtures
# are built once), the slowest modules first (tests/conftest.py: SLOWEST_FIRST). `-n 0` runs it in
# one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The suite's JVMs run many small plans, each a few times: compiled by C1 alone (no C2) and with the
# serial collector they cost ~30 % less CPU (docs/STACK.md). C1 alone would get Java's 48 MB code
# cache, which Spark's generated code fills (its sweeper then took a fifth of a server's CPU); 240 MB
# is the tiered default. Deployments compile with C2 at raised thresholds (resources/spark/session.py: JIT_OPTIONS).
export PHOTON_JVM_OPTIONS="${PHOTON_JVM_OPTIONS:--XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC}"
if [ "${1:-}" = "--quick" ]; then
  shift
  exec .venv/bin/python -m pytest -m quick -n 2 --dist loadscope --no-loadscope-reorder "$@"
fi
exec .venv/bin/python -m pytest -n 2 --dist loadscope --no-loadscope-reorder "$@"
