"""Build hook: the compiled hot path, by default (docs/PERFORMANCE.md, "A compiled hot path").

Every build of this tree (``pip install mc0`` from the sdist, ``pip install .``, ``pip install -e .``,
``python -m build``) compiles the modules mc0/native.py names (``HOT_MODULES``) with mypyc into C
extensions beside their sources, as black and mypy ship mypyc-compiled wheels; mypy, which carries
mypyc, is in pyproject's ``[build-system] requires``, so build isolation brings it (a build with
``--no-build-isolation`` needs it installed: ``./run`` does that).

The pure-Python build is the fallback, chosen on purpose with ``MC0_PURE_BUILD=1``, or taken when the
build cannot compile: no mypyc in the build environment, no working C compiler (one with Python's
headers: a probe file is compiled first), or a compile that failed.  The build never fails for
want of a compiler.  Which build it is, and why when it is pure, is said once per build on stderr
(one ``mc0: ...`` line; pip shows it with ``-v``), and ``mc0 --version`` names it afterwards.
At run time ``MC0_PURE_PYTHON=1`` loads every module from its source whatever was built.
"""

import os
import runpy
import sys
import sysconfig
import tempfile

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

PURE_BUILD_ENV = "MC0_PURE_BUILD"
PROBE = "#include <Python.h>\nint main(void) { return 0; }\n"


def say(text):
    print(f"mc0: {text}", file=sys.stderr, flush=True)


def compiler_problem():
    """Why this build environment cannot compile an extension (None: it can): the platform's C
    compiler (as setuptools configures it: CC, CFLAGS ...) must build a file that includes Python.h."""
    from distutils.ccompiler import new_compiler  # (setuptools' copy, importing setuptools provides it)
    from distutils.errors import CCompilerError, DistutilsError
    from distutils.sysconfig import customize_compiler

    compiler_name = "the C compiler"
    try:
        compiler = new_compiler(verbose=0)
        customize_compiler(compiler)
        compiler_name = " ".join(getattr(compiler, "compiler_so", None) or ["cc"])[:40].split()[0]
        with tempfile.TemporaryDirectory() as folder:
            source = os.path.join(folder, "probe.c")
            with open(source, "w") as out:
                out.write(PROBE)
            compiler.compile([source], output_dir=folder, include_dirs=[sysconfig.get_paths()["include"]])
    except (CCompilerError, DistutilsError, OSError):
        return f"no working C compiler ({compiler_name!r} could not compile a file that includes Python.h)"
    return None


def last_line(exc):
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def compiled_extensions():
    """(mypyc's extensions for HOT_MODULES, or [] with the reason the build is pure Python)."""
    if os.environ.get(PURE_BUILD_ENV, "") not in ("", "0"):
        return [], f"{PURE_BUILD_ENV}={os.environ[PURE_BUILD_ENV]}"
    try:
        from mypyc.build import mypycify
    except ImportError:
        return [], "mypyc is not in the build environment (pip install mypy, or build with isolation)"
    problem = compiler_problem()
    if problem is not None:
        return [], problem
    native = runpy.run_path(os.path.join("mc0", "native.py"))
    paths = [os.path.join(*name.split(".")) + ".py" for name in native["HOT_MODULES"]]
    # mypyc type-checks what the hot modules import, all of mc0 with it, with pyproject's [tool.mypy]
    # (strict); an isolated build environment holds none of mc0's dependencies (pyzmq, pynacl ...), so
    # the errors that makes in the other modules are silenced: the hot modules import none of them and
    # are checked in full.  The C it generates is the same, byte for byte, as with them installed.
    try:
        level = os.environ.get("MYPYC_OPT_LEVEL", "3")  # the C compiler's -O (as mypy's own setup.py reads it)
        return mypycify([*paths, "--follow-imports=silent"], opt_level=level, group_name=native["GROUP"]), None
    except (Exception, SystemExit) as exc:  # mypyc refused (it exits on a type error): the sources still run
        return [], f"mypyc failed ({last_line(exc)})"


# setup.py runs once per PEP 517 hook: only those that build need mypyc's C (a minute of CPU).
METADATA_ONLY = {"egg_info", "dist_info", "sdist", "check", "--name", "--version"}
if set(sys.argv[1:]) & METADATA_ONLY and not set(sys.argv[1:]) & {"bdist_wheel", "build", "build_ext", "install"}:
    EXTENSIONS, WHY_PURE = [], "metadata only"
else:
    EXTENSIONS, WHY_PURE = compiled_extensions()


class BuildPy(build_py):
    """Says which build this is, once per build (setup.py runs once per PEP 517 hook; this command
    once per wheel or editable install)."""

    def run(self):
        if EXTENSIONS:
            modules = len([e for e in EXTENSIONS if not e.name.endswith("__mypyc")])  # (less the shared library)
            say(f"compiling {modules} hot modules with mypyc (set {PURE_BUILD_ENV}=1 for pure Python)")
        else:
            say(f"building pure Python: {WHY_PURE}")
        super().run()


class BuildExt(build_ext):
    """A compile that fails leaves the pure-Python build (all or nothing: the compiled modules call
    each other directly), with one line saying why; the install goes on."""

    def run(self):
        try:
            super().run()
        except Exception as exc:
            for path in self.get_outputs():
                if os.path.exists(path):
                    os.remove(path)
            self.extensions = []
            self.distribution.ext_modules = []
            say(f"building pure Python: compiling failed ({last_line(exc)})")


setup(ext_modules=EXTENSIONS, cmdclass={"build_py": BuildPy, "build_ext": BuildExt})
