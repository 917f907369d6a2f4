"""engine.offload_states() / reload_states() (DeepSpeed #6011; what RLHF trainers call around generation).

After offload_states() nothing of the engine's model states is left in its device storages (memory_breakdown
shows them under "offloaded" on the host); after reload_states() training goes on bit-identically to a run that
never offloaded: at stages 0-3, with and without offload_optimizer, with and without an optimizer (a reference
model). On CPU ranks the "device" is the host memory itself, and the same copies and frees run.
"""
import pytest
import torch

import dsfast
from dsfast.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def _engine(stage, precision="fp32", offload=False, optimizer=True):
    model = _model()
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000, "gradient_clipping": 0.5,
           "zero_optimization": zero}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}
    else:
        model.requires_grad_(False)
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def _step(engine, i):
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
    loss = torch.nn.functional.mse_loss(engine(x).float(), y)
    if engine.optimizer is not None:
        engine.backward(loss)
        engine.step()
    return float(loss.detach())


def _state(engine):
    from dsfast.utils import safe_get_full_fp32_param
    out = [p.detach().float().clone() for p in engine.module.parameters()]
    if engine.optimizer is not None and engine.zero_optimization_stage() > 0:
        out += [safe_get_full_fp32_param(p).clone() for p in engine.module.parameters()]
    return out


def _device_bytes(engine):
    mem = engine.memory_breakdown()
    return sum(b for cat, per in mem.items() if cat not in ("total", "offloaded") for b in per.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage,offload", [(0, False), (1, False), (1, True), (2, False), (2, True), (3, False),
                                           (3, True)])
def test_a_round_trip_changes_no_bit_of_training(stage, offload, precision):
    ref, got = _engine(stage, precision, offload), _engine(stage, precision, offload)
    for i in range(2):
        assert _step(ref, i) == _step(got, i)
    before = _device_bytes(got)
    assert before > 0
    got.offload_states()
    assert _device_bytes(got) == 0                                             # nothing left in device storages
    assert sum(got.memory_breakdown()["offloaded"].values()) >= before         # all of it is on the host
    with pytest.raises(RuntimeError, match="reload_states"):
        _step(got, 2)
    got.reload_states()
    assert "offloaded" not in got.memory_breakdown() and _device_bytes(got) == before
    for i in range(2, 5):
        assert _step(ref, i) == _step(got, i)
    for a, b in zip(_state(got), _state(ref)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_an_engine_without_an_optimizer_offloads_its_parameters(stage):
    # DeepSpeed 0.19.8 refuses this (a reference / reward model in RLHF, #6596)
    engine = _engine(stage, "bf16", optimizer=False)
    x = torch.randn(4, 16)
    want = engine(x).float()
    engine.offload_states()
    assert _device_bytes(engine) == 0
    assert all(p.untyped_storage().nbytes() == 0 for p in engine.module.parameters()
               if p.untyped_storage().nbytes() or not hasattr(p, "ds_id"))
    engine.reload_states()
    assert torch.equal(engine(x).float(), want)


def test_include_moves_only_the_named_states():
    engine = _engine(2, "bf16")
    for i in range(2):
        _step(engine, i)
    engine.offload_states(include=[OffloadStateTypeEnum.optim_states, "hp_params"])
    mem = engine.memory_breakdown()
    assert "optimizer_states" not in mem["total"] or not sum(mem["optimizer_states"].values())
    assert not sum(mem["masters"].values()) and sum(mem["params"].values()) > 0
    engine.reload_states()
    _step(engine, 2)


def test_bad_arguments_say_what_is_valid():
    engine = _engine(1)
    with pytest.raises(ValueError, match="'moments' is not a state kind; valid: optim_states"):
        engine.offload_states(include=["moments"])
    with pytest.raises(ValueError, match="host"):
        engine.offload_states(device=OffloadDeviceEnum.nvme)
    with pytest.warns(UserWarning, match="nothing to do"):
        engine.offload_states(device="none")
    engine.offload_states()
    with pytest.raises(RuntimeError, match="offloaded already"):
        engine.offload_states()
    engine.reload_states()
    engine.reload_states()   # nothing offloaded: a no-op
    _step(engine, 0)
