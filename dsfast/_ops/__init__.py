"""Ops compiled ahead of time by `DSFAST_BUILD_OPS=1 pip install --no-build-isolation .` land here.

Empty in a plain install; dsfast.ops.load() falls through to the JIT cache then.
"""
