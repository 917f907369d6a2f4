"""deepspeed.profiling.flops_profiler (dsfast.profiling.flops_profiler): FLOPs and MACs against the analytic
counts of linear and convolution layers, per module and in total, forward only; the config-driven profile of an
engine step; the errors."""
import pytest
import torch

import dsfast
from dsfast.profiling.flops_profiler import (FlopsProfiler, get_model_profile, macs_to_string, number_to_string,
                                             params_to_string)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)                                   # 3x8x8 -> 4x6x6
        self.head = torch.nn.Sequential(torch.nn.Linear(144, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


B = 2
CONV_MACS = B * 4 * 6 * 6 * 3 * 3 * 3
L1_MACS, L2_MACS = B * 144 * 32, B * 32 * 5
TOTAL_MACS = CONV_MACS + L1_MACS + L2_MACS
PARAMS = (4 * 27 + 4) + (144 * 32 + 32) + (32 * 5 + 5)


def test_get_model_profile_counts_multiply_accumulates_of_each_layer(capsys):
    flops, macs, params = get_model_profile(Net(), input_shape=(B, 3, 8, 8), as_string=False, print_profile=False)
    assert (flops, macs, params) == (2 * TOTAL_MACS, TOTAL_MACS, PARAMS)
    assert capsys.readouterr().out == ""
    strings = get_model_profile(Net(), args=[torch.randn(B, 3, 8, 8)], print_profile=True, top_modules=2)
    assert strings == (number_to_string(2 * TOTAL_MACS), macs_to_string(TOTAL_MACS), params_to_string(PARAMS))
    out = capsys.readouterr().out
    assert "fwd MACs per device:" in out and "head.0 (Linear)" in out and "Top 2 modules" in out
    assert number_to_string(1234567) == "1.23 M" and params_to_string(7e9) == "7 B"


def test_the_profiler_gives_each_module_its_own_and_its_children_s_work_forward_only():
    model = Net()
    prof = FlopsProfiler(model)
    prof.start_profile(ignore_list=[torch.nn.ReLU])
    model(torch.randn(B, 3, 8, 8)).sum().backward()         # backward is not counted
    prof.stop_profile()
    stats = {st.name: st for st in prof._stats}
    assert "head.1" not in stats                             # ignored type: not listed
    assert (stats["conv"].flops, stats["head.0"].flops, stats["head.2"].flops) == (
        2 * CONV_MACS, 2 * L1_MACS, 2 * L2_MACS)
    assert stats["head"].flops == 2 * (L1_MACS + L2_MACS) and prof.get_total_macs() == TOTAL_MACS
    assert prof.get_total_duration() >= stats["head"].duration > 0
    model(torch.randn(B, 3, 8, 8))                           # after stop_profile: not counted
    assert prof.get_total_macs() == TOTAL_MACS
    prof.start_profile()
    for _ in range(2):
        model(torch.randn(B, 3, 8, 8))
    assert prof.get_total_macs() == 2 * TOTAL_MACS           # every forward since start_profile adds up
    prof.end_profile()
    assert prof.get_total_flops() == 0 and not model._forward_hooks and not model.conv._forward_pre_hooks


def test_a_zero3_model_counts_its_parameters_whole():
    model = Net()
    engine, *_ = dsfast.initialize(model=model, model_parameters=model.parameters(), dist_init_required=False,
                                   config={"train_batch_size": B, "optimizer": {"type": "Adam", "params": {}},
                                           "zero_optimization": {"stage": 3, "param_persistence_threshold": 0}})
    prof = FlopsProfiler(engine.module)
    prof.start_profile()
    engine(torch.randn(B, 3, 8, 8))
    prof.end_profile()
    assert prof.get_total_params() == PARAMS and engine.module.conv.weight.numel() == 0


def test_the_config_section_profiles_one_step_on_rank_0(capsys, tmp_path):
    model = Net()
    cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
           "flops_profiler": {"enabled": True, "profile_step": 2, "module_depth": 1, "top_modules": 1,
                              "detailed": True}}
    engine, *_ = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                   dist_init_required=False)
    for _ in range(8):                                       # 4 optimizer steps of 2 micro-batches
        engine.backward(engine(torch.randn(B, 3, 8, 8)).sum())
        engine.step()
    out = capsys.readouterr().out
    assert out.count("Profile Summary at step 2") == 1 and out.count("Flops Profiler") == 1
    assert f"fwd MACs per device:{' ' * 40}{macs_to_string(TOTAL_MACS)}" in out      # one micro-batch's
    assert "iter latency" in out and "samples/second" in out
    assert "  head (Sequential)" in out and "head.0 (Linear)" not in out            # module_depth 1
    assert not model._forward_hooks                                                  # hooks removed after
    cfg["flops_profiler"]["output_file"] = str(tmp_path / "profile.txt")
    cfg["flops_profiler"]["profile_step"] = 1
    engine, *_ = dsfast.initialize(model=Net(), config=cfg, dist_init_required=False,
                                   model_parameters=None)
    for _ in range(4):
        engine.backward(engine(torch.randn(B, 3, 8, 8)).sum())
        engine.step()
    assert "Profile Summary at step 1" in (tmp_path / "profile.txt").read_text()
    assert "Flops Profiler" not in capsys.readouterr().out


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        get_model_profile(lambda x: x, input_shape=(1,))
    with pytest.raises(ValueError, match=r"input_shape=\[1, 2\].*non-empty tuple"):
        get_model_profile(Net(), input_shape=[1, 2])
    with pytest.raises(ValueError, match="give input_shape, or args"):
        get_model_profile(Net())
    with pytest.raises(ValueError, match="'forward' or 'generate'"):
        get_model_profile(Net(), input_shape=(1, 3, 8, 8), mode="backward")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        FlopsProfiler(object())
