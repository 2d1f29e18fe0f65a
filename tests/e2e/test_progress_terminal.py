"""`photon run`'s progress line (photon/progress_line.py) under a pseudo-terminal: with stderr on a terminal it
shows, per datacenter and stream, the bytes left, the clicks joined per second and an ETA, on one line
rewritten in place; with `--json` (or stderr not a terminal) nothing of it, and stdout is the summary alone."""

import json
import os
import pty
import re
import select
import subprocess

import pytest

from resources.state.layout import REPO_ROOT
from tests.e2e.test_photon_run import PHOTON, photon

pytestmark = pytest.mark.e2e
PROGRESS = re.compile(r"dc1: query [0-9.]+ MB left, (ETA [0-9:?]+|done); click [0-9.]+ MB left, [0-9]+ clicks/s, "
                      r"(ETA [0-9:?]+|done)")


def run_on_a_terminal(data_dir, *extra) -> tuple[int, str, str]:
    """`photon run` with stderr on a pseudo-terminal and stdout a pipe: its exit status, stdout, and what the
    terminal received."""
    terminal, child_end = pty.openpty()
    process = subprocess.Popen([*PHOTON, "run", "--data-dir", str(data_dir), "--until-idle", *extra], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=child_end, stdin=subprocess.DEVNULL)
    os.close(child_end)
    screen = bytearray()
    while True:
        ready, _, _ = select.select([terminal], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(terminal, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            screen += chunk
        elif process.poll() is not None:
            break
    stdout = process.stdout.read().decode()
    os.close(terminal)
    return process.wait(timeout=600), stdout, screen.decode(errors="replace")


def test_a_progress_line_on_a_terminal_and_none_with_json(tmp_path):
    generated = photon("gen", "--data-dir", str(tmp_path), "--queries", "2000", "--seed", "9", "--datacenters", "dc1")
    assert generated.returncode == 0, generated.stderr
    status, stdout, screen = run_on_a_terminal(tmp_path)
    assert status == 0, screen[-3000:]
    assert PROGRESS.search(screen), screen[-3000:]
    assert re.search(r" [1-9][0-9]* clicks/s", screen), screen[-3000:]  # once the click run joined
    assert len(PROGRESS.findall(screen)) >= 2  # redrawn
    assert "\x1b[" in screen or "\r" in screen  # the line is rewritten in place, not appended
    assert "left," not in stdout and "\x1b[" not in stdout  # stdout: the summary's lines alone

    # Again with --json: the terminal gets no progress line; stdout is the summary, its last line the JSON.
    status, stdout, screen = run_on_a_terminal(tmp_path, "--json")
    assert status == 0, screen[-3000:]
    assert "left," not in screen and "\x1b[?25l" not in screen  # no live display (rich hides the cursor)
    lines = stdout.splitlines()
    summary = json.loads(lines[-1])
    assert [line.split(": ", 1)[0] for line in lines[:-1]] == list(summary_keys(lines[:-1])) and \
        set(summary_keys(lines[:-1])) == set(summary)


def summary_keys(lines: list[str]) -> list[str]:
    return [line.split(": ", 1)[0] for line in lines]
