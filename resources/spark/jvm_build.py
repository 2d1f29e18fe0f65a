"""The project's own JVM classes (resources/spark/jvm/*.java), each compiled with the JDK's `javac` against the
jars it extends into `.cache/jars/<prefix><hash of its source>.jar`: by scripts/setup.sh, and by the first
session that finds its jar missing (a source changed by a pull), in ~2 s. The jar of an older source is
removed once the new one is in place.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path


def jar_path(source: Path, prefix: str, jars_dir: Path) -> Path:
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    return jars_dir / f"{prefix}{digest}.jar"


def compiled_jar(source: Path, prefix: str, class_path: list[Path], jars_dir: Path) -> Path:
    """The jar of `source` as it is now, compiled against `class_path` first if missing."""
    jar = jar_path(source, prefix, jars_dir)
    if jar.is_file():
        return jar
    jars_dir.mkdir(parents=True, exist_ok=True)
    with open(jars_dir / f".{prefix}lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time (parallel test workers, two datacenters)
        if not jar.is_file():
            _build(source, jar, class_path, jars_dir)
    for stale in jars_dir.glob(f"{prefix}*.jar"):
        if stale != jar:
            stale.unlink(missing_ok=True)
    return jar


def _build(source: Path, jar: Path, class_path: list[Path], jars_dir: Path) -> None:
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError(f"javac not found: Photon compiles {source.name} with a JDK 17 (see README, setup)")
    missing = [str(path) for path in class_path if not path.is_file()]
    if missing or not class_path:
        raise RuntimeError(f"jars to compile {source.name} against are missing ({missing or class_path}): "
                           "run scripts/setup.sh first")
    with tempfile.TemporaryDirectory(dir=jars_dir) as build:
        compiled = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-d", build, "-cp", ":".join(map(str, class_path)), str(source)],
            capture_output=True, text=True)
        if compiled.returncode != 0:
            raise RuntimeError(f"compiling {source.name} failed: {compiled.stderr.strip()}")
        partial = Path(build) / jar.name
        with zipfile.ZipFile(partial, "w") as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
            for path in sorted(Path(build).rglob("*.class")):
                archive.write(path, path.relative_to(build).as_posix())
        partial.replace(jar)  # whole or not at all, for a session starting meanwhile
