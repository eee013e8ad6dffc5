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
The broker loop's socket work (``CYTHON_MODULES``: ``mc0/broker/routerio.pyx``) is compiled with
Cython beside them, against libzmq through pyzmq's Cython API and linked to the libzmq pyzmq itself
loads; Cython and pyzmq are build requirements too.  It needs libzmq's header, ``zmq.h`` (Debian:
``libzmq3-dev``, which ``./run`` installs; pyzmq's wheels ship the library, not the header): without
it that one module stays pure Python (its ``.py``, the same contract), said in the same line; the
mypyc modules do not depend on it, nor it on them.
At run time ``MC0_PURE_PYTHON=1`` loads every module from its source whatever was built.
"""

import glob
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
    """(mypyc's extensions for HOT_MODULES, or [] with the reason the build is pure Python).  Called
    once a C compiler is known to work."""
    try:
        from mypyc.build import mypycify
    except ImportError:
        return [], "mypyc is not in the build environment (pip install mypy, or build with isolation)"
    native = runpy.run_path(os.path.join("mc0", "native.py"))
    paths = [os.path.join(*name.split(".")) + ".py" for name in native["HOT_MODULES"]]
    # mypyc type-checks what the hot modules import, all of mc0 with it, with pyproject's [tool.mypy]
    # (strict); an isolated build environment holds none of mc0's runtime dependencies (pynacl ...), so
    # the errors that makes in the other modules are silenced: the hot modules import none of them and
    # are checked in full.  The C it generates is the same, byte for byte, as with them installed.
    try:
        level = os.environ.get("MYPYC_OPT_LEVEL", "3")  # the C compiler's -O (as mypy's own setup.py reads it)
        return mypycify([*paths, "--follow-imports=silent"], opt_level=level, group_name=native["GROUP"]), None
    except (Exception, SystemExit) as exc:  # mypyc refused (it exits on a type error): the sources still run
        return [], f"mypyc failed ({last_line(exc)})"


def cython_extensions():
    """(The Cython modules, mc0/native.py's CYTHON_MODULES, each from its ``.pyx`` against libzmq through
    pyzmq's Cython API, linked to the libzmq pyzmq itself loads (its wheel's bundled copy, else the
    system's); or [] with the reason they stay pure Python).  Called once a C compiler is known to work."""
    try:
        import zmq
        from Cython.Build import cythonize
    except ImportError as exc:
        return [], f"{exc.name} is not in the build environment (pip install cython pyzmq, or build with isolation)"
    from setuptools import Extension

    includes = zmq.get_includes()
    if not any(os.path.exists(os.path.join(d, "zmq.h")) for d in [*includes, "/usr/include", "/usr/local/include"]):
        return [], "no zmq.h, libzmq's header (Debian: apt-get install libzmq3-dev)"
    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(zmq.__file__))), "pyzmq.libs")
    bundled = sorted(glob.glob(os.path.join(libs, "libzmq*.so*")))
    if bundled:  # (a wheel's libzmq: site-packages/pyzmq.libs, beside site-packages/mc0/broker/)
        link = {
            "library_dirs": [libs],
            "libraries": [":" + os.path.basename(bundled[0])],
            "runtime_library_dirs": [libs],
            "extra_link_args": ["-Wl,-rpath,$ORIGIN/../../pyzmq.libs"],
        }
    else:
        link = {"libraries": ["zmq"]}
    names = runpy.run_path(os.path.join("mc0", "native.py"))["CYTHON_MODULES"]
    extensions = [
        Extension(name, [os.path.join(*name.split(".")) + ".pyx"], include_dirs=includes, **link) for name in names
    ]
    try:
        return cythonize(extensions, language_level=3, quiet=True), None
    except Exception as exc:  # Cython refused: the .py beside each still runs
        return [], f"Cython failed ({last_line(exc)})"


# setup.py runs once per PEP 517 hook: only those that build need mypyc's C (a minute of CPU).
METADATA_ONLY = {"egg_info", "dist_info", "sdist", "check", "--name", "--version"}
if set(sys.argv[1:]) & METADATA_ONLY and not set(sys.argv[1:]) & {"bdist_wheel", "build", "build_ext", "install"}:
    EXTENSIONS, WHY_PURE = [], "metadata only"
    NATIVE_LOOP, WHY_NO_NATIVE_LOOP = [], "metadata only"
else:
    if os.environ.get(PURE_BUILD_ENV, "") not in ("", "0"):
        WHY_PURE = f"{PURE_BUILD_ENV}={os.environ[PURE_BUILD_ENV]}"
    else:
        WHY_PURE = compiler_problem()
    if WHY_PURE is None:
        EXTENSIONS, WHY_PURE = compiled_extensions()
        NATIVE_LOOP, WHY_NO_NATIVE_LOOP = cython_extensions()
    else:
        EXTENSIONS, NATIVE_LOOP, WHY_NO_NATIVE_LOOP = [], [], WHY_PURE
NATIVE_LOOP_NAMES = {extension.name for extension in NATIVE_LOOP}


class BuildPy(build_py):
    """Says which build this is, once per build (setup.py runs once per PEP 517 hook; this command
    once per wheel or editable install)."""

    def run(self):
        loop = "the broker's socket loop with Cython" if NATIVE_LOOP else ""
        if EXTENSIONS:
            modules = len([e for e in EXTENSIONS if not e.name.endswith("__mypyc")])  # (less the shared library)
            built = f"{modules} hot modules with mypyc" + (f" and {loop}" if loop else "")
            pure_loop = "" if loop else f"; the broker's socket loop stays pure Python: {WHY_NO_NATIVE_LOOP}"
            say(f"compiling {built} (set {PURE_BUILD_ENV}=1 for pure Python){pure_loop}")
        elif loop:
            say(f"compiling {loop}; the hot modules stay pure Python: {WHY_PURE}")
        else:
            say(f"building pure Python: {WHY_PURE}")
        super().run()


class BuildExt(build_ext):
    """A compile that fails leaves the pure-Python build (all or nothing: the compiled modules call
    each other directly), with one line saying why; the install goes on.  The Cython modules stand
    alone: one that fails to compile leaves its own ``.py``, said in one line."""

    def build_extension(self, ext):
        if ext.name not in NATIVE_LOOP_NAMES:
            return super().build_extension(ext)
        try:
            return super().build_extension(ext)
        except Exception as exc:
            path = self.get_ext_fullpath(ext.name)
            if os.path.exists(path):
                os.remove(path)
            say(f"the broker's socket loop stays pure Python: compiling it failed ({last_line(exc)})")
            return None

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


setup(ext_modules=EXTENSIONS + NATIVE_LOOP, cmdclass={"build_py": BuildPy, "build_ext": BuildExt})
