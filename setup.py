"""Build hook for the optional compiled hot path (docs/PERFORMANCE.md, "A compiled hot path").

``MC0_COMPILE=1 pip install --no-build-isolation -e .`` (what ``./run`` does, mypy being
installed by then) compiles the modules that mc0/native.py names with mypyc into C
extensions beside their sources.  Without MC0_COMPILE (a plain ``pip install``), mc0 is pure
Python, and so it is with ``MC0_PURE_PYTHON=1`` at run time whatever was built.
"""

import os
import runpy

from setuptools import setup

ext_modules = []
if os.environ.get("MC0_COMPILE", "") not in ("", "0"):
    from mypyc.build import mypycify  # MC0_COMPILE needs mypy in the build environment (--no-build-isolation)

    native = runpy.run_path(os.path.join("mc0", "native.py"))
    paths = [os.path.join(*name.split(".")) + ".py" for name in native["HOT_MODULES"]]
    ext_modules = mypycify(paths, opt_level="3", group_name=native["GROUP"])

setup(ext_modules=ext_modules)
