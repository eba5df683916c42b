# SPDX-License-Identifier: MIT
"""Where `import kvpage` finds libkvpage.so (kvpage/_lib.py, docs/python.md):
KVPAGE_LIB first, then next to the package, then the source tree's build,
then the system loader. Each case runs a fresh Python on a copy of the
package made outside the source tree, so that no other rule can answer."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvpage

PKG = Path(kvpage.__file__).resolve().parent


def lib_file():
    """The real file of the library the tests use."""
    return Path(os.path.realpath(kvpage.lib_path))


def run(pkg_parent, env_extra, code="import kvpage; print(kvpage.lib_path)"):
    env = {k: v for k, v in os.environ.items() if k not in ("KVPAGE_LIB", "LD_LIBRARY_PATH")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(pkg_parent)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, cwd=str(pkg_parent))


@pytest.fixture
def copy(tmp_path):
    shutil.copytree(PKG, tmp_path / "kvpage", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_kvpage_lib_first(copy):
    shutil.copy(lib_file(), copy / "kvpage" / "libkvpage.so.0")  # would be found next
    r = run(copy, {"KVPAGE_LIB": str(lib_file())})
    assert r.returncode == 0 and r.stdout.strip() == str(lib_file()), r.stderr
    r = run(copy, {"KVPAGE_LIB": str(copy / "nope.so")})
    assert r.returncode != 0 and "KVPAGE_LIB=" in r.stderr and "ImportError" in r.stderr


def test_next_to_package(copy):
    shutil.copy(lib_file(), copy / "kvpage" / "libkvpage.so.0")
    r = run(copy, {})
    assert r.returncode == 0 and r.stdout.strip() == str(copy / "kvpage" / "libkvpage.so.0")


def test_system_loader_then_not_found(copy):
    r = run(copy, {"LD_LIBRARY_PATH": str(lib_file().parent)})
    assert r.returncode == 0 and r.stdout.strip() == "libkvpage.so.0", r.stderr
    r = run(copy, {})
    if r.returncode == 0:  # an installed libkvpage.so on the loader path answered
        assert r.stdout.strip().startswith("libkvpage.so")
    else:
        assert "libkvpage.so not found" in r.stderr and "KVPAGE_LIB" in r.stderr


def test_build_tree(tmp_path):
    """A package inside a source checkout finds <repo>/build/lib/libkvpage.so."""
    repo = tmp_path / "repo"
    shutil.copytree(PKG, repo / "python" / "kvpage", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "include" / "kvpage").mkdir(parents=True)
    (repo / "include" / "kvpage" / "kvpage.h").write_text("")
    (repo / "build" / "lib").mkdir(parents=True)
    shutil.copy(lib_file(), repo / "build" / "lib" / "libkvpage.so")
    r = run(repo / "python", {})
    assert r.returncode == 0 and r.stdout.strip() == str(repo / "build" / "lib" / "libkvpage.so")
