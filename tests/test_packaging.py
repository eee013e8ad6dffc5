"""A package people can install without the repository (issues 27, 36): ``python -m build`` of a copy
of the sources (the sdist first, then the wheel from the sdist, as ``pip install mc0`` from an index
builds it), installed into a fresh virtualenv, run from a folder that is not the checkout: its hot
path compiled by default (mypyc, and the broker's socket loop with Cython, from pyproject's
``[build-system] requires``; the socket loop needs libzmq's ``zmq.h``, which ``./run`` installs), and pure Python when
asked for (``MC0_PURE_BUILD=1``) or when no C compiler works, said in one line, never a failed build.

The wheel is built with build isolation: setuptools, mypy, Cython and pyzmq come from the package index into a
throwaway environment, as for any user (pip's cache keeps them after the first time).  What it
costs: mypyc's type check and code generation for the hot modules, then the C compiler, with
``MYPYC_OPT_LEVEL=0`` (the C compiler's ``-O0``, the one thing that differs from a user's build,
which compiles at ``-O3``: about half the CPU) - about a minute of CPU in all (1m04s user,
measured without isolation; each isolated environment adds a pip install of setuptools and mypy).
What the test claims, that every hot module of the installed wheel is compiled, does not depend on
the C optimisation level; the ``-O3`` build's behaviour is the suite's own (``./run test`` builds it).
The fresh venv gets the wheel with ``--no-deps --no-index``; its dependencies come from this venv's
site-packages, added to the fresh venv by a ``.pth`` line (which loads none of this venv's own
``.pth`` files, so not the checkout's editable mc0), and ``pip check`` proves the wheel's declared
requirements are met there.  The fallback builds run without isolation (this venv's setuptools and
mypy, as ``./run`` builds) and compile nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mc0 import config, native

pytestmark = [pytest.mark.long, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "pyspark_mc0.py", "mc0", "etc")
SAMPLES = (
    "mc0/etc/mc0.toml",
    "mc0/etc/journal.toml",
    "mc0/etc/mc0.service",
    "mc0/etc/grafana/mc0.json",
    "mc0/etc/prometheus/mc0-alerts.yml",
)
BUILD_TIMEOUT = 1200  # compiling under a loaded suite (6 workers on 2 cores) took minutes, not seconds
COMPILED = f"(compiled: {len(native.HOT_MODULES)} of {len(native.HOT_MODULES)} hot modules, mypyc; socket loop native)"


def run(
    *command: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def copy_sources(folder: Path) -> Path:
    """A copy of what the sdist is made of (a build writes build/ and *.egg-info where it runs),
    without what a build of the checkout left (its extensions, caches)."""
    source = folder / "src"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            # (not what a build of the checkout left: extensions, and the C Cython writes beside a .pyx)
            ignored = shutil.ignore_patterns("__pycache__", "*.so", "*.c")
            shutil.copytree(path, source / name, symlinks=True, ignore=ignored)
        else:
            shutil.copy2(path, source / name)
    return source


def mc0_lines(output: str) -> list[str]:
    """The build's own lines (setup.py says which build it is on stderr as ``mc0: ...``)."""
    return [line.strip() for line in output.splitlines() if line.strip().startswith("mc0: ")]


def fresh_venv(base: Path, wheel: Path) -> tuple[Path, dict[str, str]]:
    """A new virtualenv holding ``wheel`` and, through a ``.pth`` line, this venv's dependencies;
    (its folder, the environment to run it in)."""
    venv = base / "venv"
    made = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=base)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check")
    added = run(*pip, "install", "--no-deps", "--no-index", wheel, cwd=base)
    assert added.returncode == 0, added.stderr[-3000:]
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=base).stdout.strip()
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    Path(purelib, "mc0-test-dependencies.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    checked = run(*pip, "check", cwd=base)  # (it speaks of this venv's other packages too: eventmq's old pins)
    unmet = [line for line in checked.stdout.splitlines() if line.startswith("mc0 ")]
    assert not unmet and not checked.stderr.strip(), checked.stdout + checked.stderr  # mc0's requirements are met
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MC0_", "PYTHON"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return venv, env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(the sdist, the wheel built from it, what the build said)."""
    base = tmp_path_factory.mktemp("packaging")
    source = copy_sources(base)
    dist = base / "dist"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MC0_")}, "MYPYC_OPT_LEVEL": "0"}
    # No source folder option: python -m build makes the sdist, then the wheel from the unpacked sdist.
    made = run(sys.executable, "-m", "build", "--outdir", dist, source, cwd=base, env=env, timeout=BUILD_TIMEOUT)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    (sdist,) = dist.glob("mc0-*.tar.gz")
    (wheel,) = dist.glob("mc0-*.whl")
    return sdist, wheel, made.stdout + made.stderr


@pytest.fixture(scope="module")
def installed(
    built: tuple[Path, Path, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """(the wheel, the fresh venv, the environment to run it in)."""
    _, wheel, _ = built
    venv, env = fresh_venv(tmp_path_factory.mktemp("installed"), wheel)
    yield wheel, venv, env


def test_the_wheel_from_the_sdist_is_compiled_and_says_so_once(
    built: tuple[Path, Path, str], installed: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    sdist, wheel, said = built
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert any(n.endswith("/setup.py") for n in names) and any(n.endswith("/mc0/native.py") for n in names)
    assert not [n for n in names if n.endswith((".so", ".c"))]  # sources only: the wheel's build compiles them
    assert [n.split("/", 1)[1] for n in names if n.endswith(".pyx")] == ["mc0/broker/routerio.pyx"]
    assert wheel.name.startswith("mc0-0.1.0-cp3") and "none-any" not in wheel.name, wheel.name  # a platform wheel
    with zipfile.ZipFile(wheel) as archive:
        extensions = [n for n in archive.namelist() if n.endswith(".so")]
    # Each hot module, their shared library, and the broker's socket loop (Cython)
    assert len(extensions) == len(native.HOT_MODULES) + 1 + len(native.CYTHON_MODULES), extensions
    assert [n for n in extensions if n.startswith("mc0/broker/routerio.")], extensions
    assert mc0_lines(said) == [
        f"mc0: compiling {len(native.HOT_MODULES)} hot modules with mypyc and the broker's socket loop with Cython"
        " (set MC0_PURE_BUILD=1 for pure Python)"
    ], said[-3000:]

    _, venv, env = installed
    version = run(venv / "bin" / "mc0", "--version", cwd=tmp_path, env=env)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"mc0 0.1.0 {COMPILED}", version.stdout + version.stderr
    code = (
        "import importlib, sys; from mc0 import native; loaded = native.compiled()\n"
        "print(all(loaded.values()), len(loaded), {importlib.import_module(m).__file__.startswith(sys.prefix)"
        " for m in loaded})"
    )
    loaded = run(venv / "bin" / "python", "-c", code, cwd=tmp_path, env=env)
    assert loaded.returncode == 0, loaded.stderr
    # Every hot module loaded compiled, the socket loop too, from the fresh venv (not the checkout).
    modules = len(native.HOT_MODULES) + len(native.CYTHON_MODULES)
    assert loaded.stdout.split() == ["True", str(modules), "{True}"], loaded.stdout
    assert not version.stderr  # nothing found stale (the installer writes sources and extensions in any order)
    pure = run(venv / "bin" / "mc0", "--version", cwd=tmp_path, env={**env, native.PURE_ENV: "1"})
    assert pure.stdout.strip() == "mc0 0.1.0 (pure Python: MC0_PURE_PYTHON=1)", pure.stdout + pure.stderr


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"MC0_PURE_BUILD": "1"}, "MC0_PURE_BUILD=1"),
        ({"CC": "false"}, "no working C compiler ('false' could not compile a file that includes Python.h)"),
    ],
    ids=["chosen", "no-compiler"],
)
def test_the_pure_build_is_chosen_or_the_fallback_and_says_so_once(
    tmp_path: Path, setting: dict[str, str], reason: str
) -> None:
    source = copy_sources(tmp_path)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("MC0_")}, **setting}
    dist = tmp_path / "dist"
    made = run(sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", dist, source, cwd=tmp_path,
               env=env, timeout=BUILD_TIMEOUT)  # fmt: skip
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]  # never a failed install
    assert mc0_lines(made.stdout + made.stderr) == [f"mc0: building pure Python: {reason}"]
    (wheel,) = dist.glob("mc0-*.whl")
    assert wheel.name == "mc0-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        assert not [n for n in archive.namelist() if n.endswith(".so")]
    if "CC" in setting:  # installed, it runs, and says which build it is
        venv, venv_env = fresh_venv(tmp_path, wheel)
        version = run(venv / "bin" / "mc0", "--version", cwd=tmp_path, env=venv_env)
        assert version.stdout.strip() == "mc0 0.1.0 (pure Python)", version.stdout + version.stderr


def test_the_wheel_holds_the_license_the_samples_and_the_metadata(installed: tuple[Path, Path, dict[str, str]]) -> None:
    wheel, _, _ = installed
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(meta_name).decode()
        license_name = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
        license_text = archive.read(license_name).decode()
        samples = {name: archive.read(name).decode() for name in SAMPLES}
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text  # the full text, not a pointer to it
    assert samples == {name: (ROOT / Path(name).relative_to("mc0")).read_text() for name in SAMPLES}
    assert "mc0/py.typed" in names and "pyspark_mc0.py" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "benchmarks/"))]
    assert "License-Expression: Apache-2.0" in metadata
    assert "Project-URL: Source, https://" in metadata and "Classifier: Programming Language :: Python :: 3" in metadata
    assert "Provides-Extra: memodb" in metadata and "Provides-Extra: test" not in metadata  # tools are a group
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert required and not [line for line in required if "pynng" in line or "cbor2" in line]  # mc0[memodb]


def test_installed_without_the_repository_the_commands_work(
    installed: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    _, venv, env = installed
    mc0 = venv / "bin" / "mc0"
    where = run(venv / "bin" / "python", "-c", "import mc0; print(mc0.__file__)", cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr  # the wheel's, not ours
    helped = run(mc0, "--help", cwd=tmp_path, env=env)
    assert helped.returncode == 0 and "config" in helped.stdout and "bench" in helped.stdout, helped.stderr

    sample = run(mc0, "config", "sample", cwd=tmp_path, env=env)
    assert sample.returncode == 0, sample.stderr
    parsed = config.parse(sample.stdout)
    assert parsed == config.Config()  # every key at its default, data_dir "" (the file's own folder)
    wrote = run(mc0, "config", "sample", "journal.toml", "-o", "journal.toml", cwd=tmp_path, env=env)
    assert wrote.returncode == 0 and "journals" in tomllib.loads((tmp_path / "journal.toml").read_text())
    unit = run(mc0, "config", "sample", "mc0.service", cwd=tmp_path, env=env)
    assert unit.returncode == 0 and "ExecStart=" in unit.stdout
    # The operator's monitoring files: the Grafana dashboard and the alert rules, as the checkout has them.
    dashboard = run(mc0, "config", "sample", "grafana", "-o", "mc0.json", cwd=tmp_path, env=env)
    assert dashboard.returncode == 0, dashboard.stderr
    assert (tmp_path / "mc0.json").read_text() == (ROOT / "etc" / "grafana" / "mc0.json").read_text()
    assert json.loads((tmp_path / "mc0.json").read_text())["panels"]
    alerts = run(mc0, "config", "sample", "alerts", cwd=tmp_path, env=env)
    assert alerts.returncode == 0 and alerts.stdout == (ROOT / "etc" / "prometheus" / "mc0-alerts.yml").read_text()
    again = run(mc0, "config", "sample", "grafana", "-o", "mc0.json", cwd=tmp_path, env=env)
    assert again.returncode == 1 and again.stderr.strip().splitlines() == [
        "mc0: error: mc0.json exists: give --force to overwrite it"
    ]

    bare = run(mc0, "bench", cwd=tmp_path, env=env)
    assert bare.returncode == 0 and "mc0 bench --endpoint URL" in bare.stdout, bare.stderr
    bench_help = run(mc0, "bench", "--help", cwd=tmp_path, env=env)
    assert bench_help.returncode == 0 and "--endpoint" in bench_help.stdout
    scenarios = run(mc0, "bench", "--endpoint", "tcp://127.0.0.1:1", "--help", cwd=tmp_path, env=env)
    assert scenarios.returncode == 0 and "pubsub" in scenarios.stdout, scenarios.stderr
    harness = run(mc0, "bench", "--quick", cwd=tmp_path, env=env)
    assert harness.returncode == 1 and harness.stderr.strip().splitlines() == [
        "mc0: error: mc0 bench --quick: the comparison harness (scripts/bench.py) is in a source checkout of mc0,"
        " not in the package; to load a running broker: mc0 bench --endpoint URL [SCENARIO]"
    ]

    demo = run(mc0, "demo", cwd=tmp_path, env=env)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "broker exited 0" in demo.stdout and "demo finished" in demo.stdout


def test_readme_links_work_on_a_package_index_page() -> None:
    """A package index shows README.md alone: its links must not be relative to the repository."""
    import re

    links = re.findall(r"\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert links and not [link for link in links if not link.startswith(("https://", "#"))]
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    home = urls["Source"].rstrip("/")
    assert all(link.startswith(home) for link in links if link.startswith("https://")), json.dumps(urls)
