"""Build hook for the optional compiled hot path (docs/PERFORMANCE.md, "A compiled hot path").

``MC0_COMPILE=1 pip install --no-build-isolation -e .`` (what ``./run`` does, mypy being
installed by then) compiles the modules that mc0/native.py names with mypyc into C
extensions beside their sources, and the Cython ones it names (the broker loop's socket
work, ``mc0/broker/routerio.pyx``: Cython, pyzmq and libzmq's ``zmq.h`` needed) likewise.
Without MC0_COMPILE (a plain ``pip install``), mc0 is pure Python, and so it is with
``MC0_PURE_PYTHON=1`` at run time whatever was built.
"""

import glob
import os
import runpy
import sys

from setuptools import setup


def cython_extensions(names):
    """The Cython modules ``names`` (mc0/native.py's CYTHON_MODULES), each from its ``.pyx``, against libzmq
    through pyzmq's Cython API and linked to the libzmq pyzmq itself loads (its wheel's bundled copy, found by
    its soname once pyzmq is imported, else the system's).  None, said once, without libzmq's header."""
    import zmq
    from Cython.Build import cythonize
    from setuptools import Extension

    includes = zmq.get_includes()
    if not any(os.path.exists(os.path.join(d, "zmq.h")) for d in [*includes, "/usr/include", "/usr/local/include"]):
        print(
            "mc0: no zmq.h (libzmq's header; Debian: apt-get install libzmq3-dev): the broker's socket loop "
            "stays pure Python",
            file=sys.stderr,
        )
        return []
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
    extensions = [
        Extension(name, [os.path.join(*name.split(".")) + ".pyx"], include_dirs=includes, **link) for name in names
    ]
    return cythonize(extensions, language_level=3, quiet=True)


ext_modules = []
if os.environ.get("MC0_COMPILE", "") not in ("", "0"):
    from mypyc.build import mypycify  # MC0_COMPILE needs mypy in the build environment (--no-build-isolation)

    native = runpy.run_path(os.path.join("mc0", "native.py"))
    paths = [os.path.join(*name.split(".")) + ".py" for name in native["HOT_MODULES"]]
    ext_modules = mypycify(paths, opt_level="3", group_name=native["GROUP"])
    ext_modules += cython_extensions(native["CYTHON_MODULES"])

setup(ext_modules=ext_modules)
