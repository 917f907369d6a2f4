"""deepspeed.profiling.flops_profiler: the names programs import (the code is in profiler.py)."""
from .profiler import (FlopsProfiler, duration_to_string, flops_to_string, get_model_profile,  # noqa: F401
                       macs_to_string, number_to_string, params_to_string)
