__version__ = "0.1.0"

# The DeepSpeed release whose API dsfast implements. `deepspeed.__version__` (dsfast's module attribute, the same
# object under either name) and the package metadata `dsfast alias install` writes both say DEEPSPEED_VERSION, so a
# framework's version check (`Version(deepspeed.__version__) >= Version("0.14")`) sees that API level; dsfast's own
# version is the local part, and stays here (dsfast.version.__version__) and in dsfast's package metadata.
API_LEVEL = "0.19.8"
DEEPSPEED_VERSION = f"{API_LEVEL}+dsfast.{__version__}"
