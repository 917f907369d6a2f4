# Plain `pip install .` is pure Python; ops are JIT-built on first use.
# The ahead-of-time op build (DSFAST_BUILD_OPS=1) is wired in by dsfast/ops/build (see README).
from setuptools import setup

setup()
