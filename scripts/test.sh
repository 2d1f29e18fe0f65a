#!/usr/bin/env bash
# The README's second command: set up, then run the whole test suite (extra pytest args pass through).
# `--quick`: only the quick tier (tests/conftest.py: QUICK), a few minutes, for use while working.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--quick" ]; then
  shift
  exec .venv/bin/python -m pytest -m quick "$@"
fi
exec .venv/bin/python -m pytest "$@"
