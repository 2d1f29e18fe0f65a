"""Makes the JVM class archive (resources/spark/class_archive.py) when this machine has none that fits: a Spark
Connect server started to dump the classes it loaded at its exit serves `photon run` over the demo
workload (the README's first command's), then stops. Run by scripts/setup.sh: ~75 s, once per Java,
pyspark and Delta version; an archive already there costs nothing.

`python -m photon.make_class_archive [--force]`; exit status 1 with one line on stderr when it fails (setup
then goes on without it: the pipeline runs the same, its JVMs start slower).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from resources.spark.class_archive import archive_path, stale_archives
from resources.runtime.process_groups import stop_group
from resources.state.layout import REPO_ROOT

PHOTON = [sys.executable, "-m", "photon.cli"]
# The demo's workload (scripts/demo.sh): every phase of a pass, a few seconds of work each.
TRAINING_WORKLOAD = ["--queries", "20000", "--seed", "42", "--datacenters", "dc1"]
# The JVM writes the archive at its exit after SIGTERM: ~15 s for ~200 MB here.
DUMP_SECONDS = 300.0
RUN_SECONDS = 600.0


def make_archive(path: Path, work_dir: Path) -> None:
    """The archive at `path`, from a training run over data in `work_dir`; raises RuntimeError naming the
    training's log (kept next to the archive)."""
    # Imported here: pyspark's and Dagster's imports cost seconds, which setup pays only when it trains.
    from resources.spark.connect_server import free_port, server_command, server_environment, wait_until_serving
    from resources.spark.session import JVM_OPTIONS_ENV

    data_dir, log_path = work_dir / "data", path.parent / "training.log"
    dumped = path.with_name(path.name + ".partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    dumped.unlink(missing_ok=True)
    subprocess.run([*PHOTON, "gen", "--data-dir", str(data_dir), *TRAINING_WORKLOAD], check=True,
                   cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    port = free_port()
    remote = f"sc://127.0.0.1:{port}"
    run_env = {key: value for key, value in os.environ.items() if key != JVM_OPTIONS_ENV}
    # server_command reads the JVM's options from this process's environment (resources/spark/session.py).
    os.environ[JVM_OPTIONS_ENV] = f"-XX:ArchiveClassesAtExit={dumped}"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(server_command(port), cwd=REPO_ROOT, env=server_environment(), stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_until_serving(remote, server)
            run = subprocess.run([*PHOTON, "run", "--data-dir", str(data_dir), "--until-idle", "--spark-remote", remote],
                                 cwd=REPO_ROOT, env=run_env, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_SECONDS)
            if run.returncode != 0:
                raise RuntimeError(f"the training run failed (exit status {run.returncode}): see {log_path}")
        finally:
            stop_group(server, DUMP_SECONDS)
    if not dumped.is_file():
        raise RuntimeError(f"the Connect server wrote no class archive: see {log_path}")
    os.replace(dumped, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m photon.make_class_archive", description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="make it again even if one fits")
    args = parser.parse_args(argv)
    path = archive_path()
    if path.is_file() and not args.force:
        return 0
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="photon-class-archive-") as work:
            make_archive(path, Path(work))
    except (RuntimeError, subprocess.SubprocessError, OSError) as error:
        print(f"setup: no JVM class archive, Spark starts without it: {error}", file=sys.stderr)
        return 1
    for stale in stale_archives():
        stale.unlink()
    print(f"setup: made the JVM class archive {path.relative_to(REPO_ROOT)} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
