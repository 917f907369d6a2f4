"""Every op dsfast knows, by name. The loader, the AOT build and `dsfast report` all read this list."""
from .spec import OpSpec

OPS = {}


def register(spec: OpSpec) -> OpSpec:
    OPS[spec.name] = spec
    return spec

# Each op family registers itself below (one line each).
