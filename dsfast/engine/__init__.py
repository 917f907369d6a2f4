"""The training engine: dsfast.initialize, the Engine class and DeepSpeed's command-line flags.

Files, one job each:
  initialize.py         initialize(): config -> process group -> device -> strategies -> optimizer -> Engine
  engine.py             Engine: forward / backward / step sequencing, counters, DeepSpeed-named accessors
  optimizer_factory.py  config `optimizer` section -> CPUAdam / FusedAdam / CPUSGD / FusedSGD
  data.py               training_data -> DataLoader with a DistributedSampler
  progress.py           steps_per_print progress lines, wall_clock_breakdown
  args.py               add_config_arguments

The engine talks to one state owner per ZeRO stage through dsfast.zero.owner.StateOwner (built by
dsfast.zero.build.build_owner; stage 0 is dsfast/zero/owners/replicated.py). The engine sits above zero/ and
checkpoint/, which never import it (tests/test_layers.py).
"""
from .args import add_config_arguments
from .engine import Engine, NoOptimizerError
from .initialize import initialize

DeepSpeedEngine = Engine  # DeepSpeed's name, for isinstance checks in ported scripts

__all__ = ["initialize", "add_config_arguments", "Engine", "DeepSpeedEngine", "NoOptimizerError"]
