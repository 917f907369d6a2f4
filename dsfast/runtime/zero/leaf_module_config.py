"""deepspeed.runtime.zero.leaf_module_config: the zero_optimization.leaf_module section's model and its defaults under
DeepSpeed's names (dsfast's own, dsfast.config.zero)."""
from ...config.zero import DEFAULT_LEAF_MODULE_CLASSES  # noqa: F401
from ...config.zero import LeafModuleConfig as DeepSpeedZeroLeafModuleConfig  # noqa: F401

DEFAULT_LEAF_MODULE_NAMES = []          # DeepSpeed 0.19.8's: none by name
DEFAULT_LEAF_MODULE_NAME_SUFFIXES = []  # nor by suffix
