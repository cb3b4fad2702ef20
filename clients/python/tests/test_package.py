"""The package builds into a wheel with the standard tooling (pyproject.toml's build-system),
holding the module the tests import."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_builds_a_wheel_with_its_modules(tmp_path):
    # Built from a copy (a build writes into the tree it builds), without build isolation so that
    # it needs no download: the backend the build-system table names is a test requirement.
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copytree(ROOT / "kafka_delay", src / "kafka_delay", ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("kafka_delay-0.1.0-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("contract.py", "helpers.py", "__init__.py"):
        assert f"kafka_delay/{module}" in names, names


def test_pyproject_names_its_build_backend():
    # Without the table, PEP 517 front ends fall back to a legacy setuptools build and warn.
    tomllib = __import__("tomllib")  # Python 3.11+, where the tests run
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    assert table["build-backend"] == "setuptools.build_meta"
    assert any(r.startswith("setuptools") for r in table["requires"])
