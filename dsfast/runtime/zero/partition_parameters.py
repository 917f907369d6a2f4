"""deepspeed.runtime.zero.partition_parameters: the names programs import from it (ZeroParamStatus to test
`param.ds_status`, Init, GatheredParameters)."""
from ...zero import GatheredParameters, Init, ZeroParamStatus, register_external_parameter  # noqa: F401
