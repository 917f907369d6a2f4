"""The methods DeepSpeed puts on ZeRO stage 3 parameters (param.all_gather_coalesced / all_gather / partition) and
deepspeed.runtime.zero.partition_parameters' handle types: gathered values are the parameters' own, partition()
releases them, the handles' wait() takes DeepSpeed's keyword, errors name the bad argument; destroy() removes the
methods with the other ds_* attributes."""
import pytest
import torch

import dsfast
from dsfast.runtime.zero.partition_parameters import (MultipleAllGatherHandles, ZeroParamStatus,
                                                      partitioned_param_data_shape)

CFG = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
       "zero_optimization": {"stage": 3}}


class Holder(torch.nn.Module):
    def __init__(self, numels=(5, 7, 4)):
        super().__init__()
        for i, n in enumerate(numels):
            self.register_parameter(f"p{i}", torch.nn.Parameter(torch.arange(1, n + 1, dtype=torch.float32)))


def _partitioned():
    with dsfast.zero.Init(config_dict_or_path=CFG):
        module = Holder()
    return module, [module.p0, module.p1, module.p2]


def test_all_gather_coalesced_makes_every_parameter_whole_with_its_values_and_partition_releases_them():
    _, params = _partitioned()
    assert all(list(p.shape) == partitioned_param_data_shape for p in params)
    handle = params[0].all_gather_coalesced(params)
    handle.wait()
    for p, n in zip(params, (5, 7, 4)):
        assert p.ds_status is ZeroParamStatus.AVAILABLE
        assert torch.equal(p.data, torch.arange(1, n + 1, dtype=torch.float32))
    params[1].partition(params)
    assert all(p.ds_status is ZeroParamStatus.NOT_AVAILABLE and p.numel() == 0 for p in params)
    params[2].all_gather()   # this parameter alone
    assert params[2].numel() == 4 and params[0].numel() == 0
    params[2].partition()
    assert params[2].numel() == 0


def test_partition_leaves_a_parameter_held_by_gathered_parameters_whole():
    _, params = _partitioned()
    with dsfast.zero.GatheredParameters(params[:1]):
        params[0].partition()
        assert params[0].numel() == 5
    assert params[0].numel() == 0


def test_multiple_all_gather_handles_waits_on_each_with_the_keyword():
    class Recorder:
        def wait(self, *, handle_dependency=True):
            self.got = handle_dependency
    _, params = _partitioned()
    handles = [params[0].all_gather_coalesced(params[:2]), Recorder(), Recorder()]
    MultipleAllGatherHandles(handles).wait(handle_dependency=False)
    assert [h.got for h in handles[1:]] == [False, False]
    assert params[1].numel() == 7


def test_errors_name_the_argument_at_fault():
    _, params = _partitioned()
    plain = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=r"params\[1\] \(shape \(3,\)\) is not a ZeRO stage 3 parameter"):
        params[0].all_gather_coalesced([params[1], plain])
    with pytest.raises(TypeError, match="params must be an iterable of ZeRO stage 3 parameters, got None"):
        params[0].all_gather_coalesced(None)
    with pytest.raises(ValueError, match="quantize=True.* not in dsfast"):
        params[0].all_gather_coalesced(params, quantize=True)
    with pytest.raises(ValueError, match=r"partition: params\[0\]"):
        params[0].partition([plain])


def test_destroy_removes_the_methods_with_the_other_ds_attributes():
    module, params = _partitioned()
    engine = dsfast.initialize(model=module, model_parameters=module.parameters(), config=CFG,
                               dist_init_required=False)[0]
    assert callable(engine.module.p0.all_gather_coalesced)
    engine.destroy()
    for p in params:
        assert not any(hasattr(p, a) for a in ("all_gather_coalesced", "all_gather", "partition", "ds_id"))
