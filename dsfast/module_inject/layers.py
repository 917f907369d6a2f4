"""deepspeed.module_inject.layers.GatherReplacedLayerParams: gathers the shards of AutoTP-replaced layers around a
block (Hugging Face's save and load under DeepSpeed's tensor parallelism use it). dsfast replaces no layers, so for
its parameters it does what DeepSpeed's does for parameters of layers that were not replaced: nothing. A parameter
that DeepSpeed's AutoTP marked as replaced (ds_is_replaced_module) is refused: dsfast cannot gather it."""
from collections.abc import Iterable

import torch

from ..unsupported import refuse

DS_IS_REPLACED_MODULE = "ds_is_replaced_module"


class GatherReplacedLayerParams:
    def __init__(self, params, module, enabled=True):
        self.module = module
        self.enabled = False
        if not enabled:
            return
        self.params = list(params) if isinstance(params, Iterable) and not isinstance(params, torch.Tensor) \
            else [params]
        replaced = [p for p in self.params if getattr(p, DS_IS_REPLACED_MODULE, False)]
        if replaced:
            refuse(f"GatherReplacedLayerParams on {len(replaced)} parameter(s) of AutoTP-replaced layers "
                   f"(shape {tuple(replaced[0].shape)}, ...)", "tensor parallelism (AutoTP)",
                   "load the model without tensor parallelism, or run this program with DeepSpeed itself")

    def __enter__(self):
        return None

    def __exit__(self, exc_type, exc_value, traceback):
        return None
