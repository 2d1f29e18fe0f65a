#!/usr/bin/env bash
# The README's second command: set up, then run the whole test suite (extra pytest args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
