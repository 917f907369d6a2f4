"""deepspeed.runtime.engine: the engine class under DeepSpeed's path (for isinstance checks and type hints), with the
type aliases and the constant programs import from it beside the class."""
from typing import Callable, Dict, Iterable, Union

from torch.nn import Parameter
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from ..engine import DeepSpeedEngine, Engine  # noqa: F401

# what initialize(optimizer=..., lr_scheduler=...) also accepts: a callable building one from the parameters
# (or parameter groups) / from the optimizer
DeepSpeedOptimizerCallable = Callable[[Union[Iterable[Parameter], Dict[str, Iterable]]], Optimizer]
DeepSpeedSchedulerCallable = Callable[[Optimizer], LRScheduler]

# DeepSpeed's allreduce bucket size for its memory-optimised gradient allreduce (an engine default frameworks read)
MEMORY_OPT_ALLREDUCE_SIZE = 500000000
