"""The training engine: dsfast.initialize, the Engine class and DeepSpeed's command-line flags."""
from .args import add_config_arguments
from .engine import Engine, NoOptimizerError
from .initialize import initialize

DeepSpeedEngine = Engine  # DeepSpeed's name, for isinstance checks in ported scripts

__all__ = ["initialize", "add_config_arguments", "Engine", "DeepSpeedEngine", "NoOptimizerError"]
