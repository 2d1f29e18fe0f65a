"""The repository's check scripts, run as a developer runs them: in a subprocess, on a root."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def run_script():
    """run_script(name, root): scripts/<name> with `--root root`, its output captured."""
    def run(name: str, root: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPTS / name), "--root", str(root)], capture_output=True, text=True)

    return run
