"""deepspeed.runtime.zero: where DeepSpeed defines the stage 3 API that `deepspeed.zero` re-exports."""
from ...zero import (GatheredParameters, Init, ZeroParamStatus, ZeroParamType,  # noqa: F401
                    register_external_parameter, unregister_external_parameter)
from ...zero.params.unwrap_generation import unwrap_model_for_generation  # noqa: F401,E402
