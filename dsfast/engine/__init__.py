"""The training engine: dsfast.initialize, the Engine class and DeepSpeed's command-line flags.

Files, one job each:
  initialize.py         initialize(): config -> process group -> device -> strategies -> optimizer -> Engine
  engine.py             Engine: forward / backward / step sequencing, counters, DeepSpeed-named accessors
  state_owner.py        what a stage's state owner provides; memory_breakdown counting
  replicated.py         stage 0's owner: precision strategy + all-reduce + the step (zero/decide.py, amp_step)
  grad_buffers.py       flat gradient buckets (param.grad are slices of them in fp32)
  grad_sync.py          gradient synchronisation strategy per ZeRO stage (stage 0: bucketed all-reduce in backward)
  shm_reduce.py         stage-0 reduction through shared memory for same-host CPU ranks (gloo only for barriers)
  mixed_precision.py    fp32 / fp16 / bf16 strategy (fp32 master weights, where the 16-bit copies are written)
  optimizer_factory.py  config `optimizer` section -> CPUAdam / FusedAdam / CPUSGD / FusedSGD
  data.py               training_data -> DataLoader with a DistributedSampler
  progress.py           steps_per_print progress lines, wall_clock_breakdown
  args.py               add_config_arguments

The engine talks to one state owner per ZeRO stage (state_owner.py lists its methods): replicated.py for stage 0
(precision strategy + all-reduce), dsfast/zero/sharded.py for stages 1 and 2. Stage 3 adds an owner that gathers
parameters around each module's forward. Checkpoints read the owner's checkpoint_layout().
"""
from .args import add_config_arguments
from .engine import Engine, NoOptimizerError
from .initialize import initialize

DeepSpeedEngine = Engine  # DeepSpeed's name, for isinstance checks in ported scripts

__all__ = ["initialize", "add_config_arguments", "Engine", "DeepSpeedEngine", "NoOptimizerError"]
