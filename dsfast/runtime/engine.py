"""deepspeed.runtime.engine: the engine class under DeepSpeed's path (for isinstance checks and type hints)."""
from ..engine import DeepSpeedEngine, Engine  # noqa: F401
