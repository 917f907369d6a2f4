"""deepspeed.runtime.zero: where DeepSpeed defines the stage 3 API that `deepspeed.zero` re-exports."""
from ...zero import GatheredParameters, Init, ZeroParamStatus, register_external_parameter  # noqa: F401
