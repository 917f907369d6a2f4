"""LR schedules: values at chosen steps from DeepSpeed's formulas, config errors, state, optional DeepSpeed check."""
import inspect
import math

import pytest
import torch

from _deepspeed_cases import (GOLDEN_DEEPSPEED, LR_CASES, LR_STEPS, deepspeed_traces, load_golden, lr_case_id,
                              lr_optimizer, lr_trace)
from dsfast.config import DsConfigError
from dsfast.config.scheduler import SCHEDULER_PARAMS
from dsfast.schedulers import (SCHEDULES, LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR,
                               build_lr_scheduler)


def adamw(lr=0.01, groups=1):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(groups)]
    return torch.optim.AdamW([{"params": [p]} for p in params], lr=lr, betas=(0.9, 0.999))


def lrs_after_steps(sched, opt, n):
    """lr in the optimizer at construction, then after each of n step() calls."""
    out = [opt.param_groups[0]["lr"]]
    for _ in range(n):
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


# ------------------------------------------------------------------------------------------------ WarmupLR
def test_warmup_log():
    opt = adamw()
    s = WarmupLR(opt, warmup_min_lr=0.001, warmup_max_lr=0.011, warmup_num_steps=10)
    got = lrs_after_steps(s, opt, 12)
    # construction (t=-1) and first step (t=0) both give min; t: min + 0.01 * ln(t+1)/ln(10); t >= 10: max
    assert got[0] == pytest.approx(0.001) and got[1] == pytest.approx(0.001)
    assert got[2] == pytest.approx(0.001 + 0.01 * math.log(2) / math.log(10))
    assert got[5] == pytest.approx(0.001 + 0.01 * math.log(5) / math.log(10))
    assert got[10] == pytest.approx(0.011)           # t = 9: ln(10)/ln(10) = 1
    assert got[11] == got[12] == pytest.approx(0.011)
    assert s.get_last_lr() == [pytest.approx(0.011)]
    assert s.state_dict() == {"last_batch_iteration": 11}


def test_warmup_linear_and_max_lr_defaults_to_optimizer_lr():
    opt = adamw(lr=0.02)
    s = WarmupLR(opt, warmup_num_steps=4, warmup_type="linear")
    got = lrs_after_steps(s, opt, 6)
    assert got == pytest.approx([0.0, 0.0, 0.005, 0.01, 0.015, 0.02, 0.02])


def test_warmup_num_steps_below_two_acts_as_two():
    opt = adamw()
    s = WarmupLR(opt, warmup_max_lr=1.0, warmup_num_steps=1)
    assert lrs_after_steps(s, opt, 3) == pytest.approx([0.0, 0.0, 1.0, 1.0])   # log: ln(2)/ln(2) at t=1


# ------------------------------------------------------------------------------------------------ WarmupDecayLR
def test_warmup_decay_linear():
    opt = adamw()
    s = WarmupDecayLR(opt, total_num_steps=20, warmup_max_lr=0.1, warmup_num_steps=10, warmup_type="linear")
    got = lrs_after_steps(s, opt, 22)
    assert got[4] == pytest.approx(0.1 * 3 / 10)       # t = 3
    assert got[11] == pytest.approx(0.1 * (20 - 10) / 10)   # t = 10: start of decay
    assert got[16] == pytest.approx(0.1 * (20 - 15) / 10)   # t = 15
    assert got[21] == pytest.approx(0.0) and got[22] == 0.0  # t = 20, 21: clamped at 0
    assert WarmupDecayLR(adamw(), total_num_steps=5).max_lrs == [0.001]   # DeepSpeed's default max here


# ------------------------------------------------------------------------------------------------ WarmupCosineLR
def test_warmup_cosine():
    opt = adamw(lr=0.5)
    s = WarmupCosineLR(opt, total_num_steps=14, warmup_min_ratio=0.1, warmup_num_steps=4, cos_min_ratio=0.01,
                       warmup_type="linear")
    got = lrs_after_steps(s, opt, 16)
    assert got[0] == 0.0                                        # DeepSpeed: 0 until the first step
    assert got[1] == pytest.approx(0.5 * 0.1)                   # t = 0
    assert got[3] == pytest.approx(0.5 * (0.1 + 0.5 * 0.9))     # t = 2: factor 2/4
    # t = 4: progress (4-4+1)/(14-4) = 0.1
    assert got[5] == pytest.approx(0.5 * (0.01 + 0.99 * (1 + math.cos(math.pi * 0.1)) / 2))
    assert got[9] == pytest.approx(0.5 * (0.01 + 0.99 * 0.5))  # t = 8: progress 0.5
    assert got[14] == pytest.approx(0.5 * 0.01) and got[16] == pytest.approx(0.5 * 0.01)   # end, then held


# ------------------------------------------------------------------------------------------------ OneCycle
def test_one_cycle_lr_and_momentum():
    opt = adamw()
    s = OneCycle(opt, cycle_min_lr=0.1, cycle_max_lr=1.0, cycle_first_step_size=4, cycle_second_step_size=2,
                 cycle_min_mom=0.8, cycle_max_mom=0.9)
    assert opt.param_groups[0]["lr"] == 0.1 and opt.param_groups[0]["betas"] == (0.8, 0.999)
    lr, b1 = [], []
    for _ in range(8):
        s.step()
        lr.append(opt.param_groups[0]["lr"])
        b1.append(opt.param_groups[0]["betas"][0])
    # i = t+1 = 1..4 climbs a quarter each way up, 5..6 comes down in halves; after the cycle: min (no decay)
    assert lr == pytest.approx([0.325, 0.55, 0.775, 1.0, 0.55, 0.1, 0.1, 0.1])
    assert b1 == pytest.approx([0.875, 0.85, 0.825, 0.8, 0.85, 0.9, 0.9, 0.9])
    assert opt.param_groups[0]["betas"][1] == 0.999   # beta2 kept (DeepSpeed would write 0.99)


def test_one_cycle_decay_and_stairs():
    opt = adamw()
    s = OneCycle(opt, cycle_min_lr=0.2, cycle_max_lr=1.0, cycle_first_step_size=2, decay_lr_rate=0.5,
                 decay_step_size=2, cycle_momentum=False)
    got = lrs_after_steps(s, opt, 7)
    # t = 4: decay index 1 -> 0.2 / (1 + 0.5 * 1/2); t = 5: 0.2 / (1 + 0.5)
    assert got[5] == pytest.approx(0.2 / 1.25) and got[6] == pytest.approx(0.2 / 1.5)
    stairs = OneCycle(adamw(), cycle_min_lr=0.0, cycle_max_lr=1.0, cycle_first_step_size=4,
                      cycle_first_stair_count=2, cycle_momentum=False)
    got = lrs_after_steps(stairs, stairs.optimizer, 4)
    assert got[1:] == pytest.approx([0.0, 0.5, 0.5, 1.0])    # floor(i * 2 / 4) / 2


def test_one_cycle_sgd_has_no_betas():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)
    s = OneCycle(opt, cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=2)
    assert s.cycle_momentum is False and "betas" not in opt.param_groups[0]
    s.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.055)


# ------------------------------------------------------------------------------------------------ LRRangeTest
def test_lr_range_test():
    opt = adamw()
    s = LRRangeTest(opt, lr_range_test_min_lr=0.01, lr_range_test_step_size=4, lr_range_test_step_rate=2.0)
    got = lrs_after_steps(s, opt, 4)
    assert got == pytest.approx([0.01, 0.01 * 1.5, 0.01 * 2, 0.01 * 2.5, 0.01 * 3])
    s2 = LRRangeTest(adamw(), lr_range_test_min_lr=0.01, lr_range_test_step_size=2, lr_range_test_staircase=True)
    got = lrs_after_steps(s2, s2.optimizer, 4)
    assert got == pytest.approx([0.01, 0.01, 0.02, 0.02, 0.03])


# ------------------------------------------------------------------------------------------------ groups, state
def test_per_group_values_and_length_check():
    opt = adamw(groups=2)
    s = WarmupLR(opt, warmup_min_lr=[0.0, 0.1], warmup_max_lr=[1.0, 0.2], warmup_num_steps=2,
                 warmup_type="linear")
    s.step()
    s.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5, 0.15])
    with pytest.raises(ValueError, match="warmup_max_lr: expected 2 values"):
        WarmupLR(opt, warmup_max_lr=[1.0, 2.0, 3.0])


def test_state_dict_round_trip_resumes_the_same_lrs():
    cfg = {"type": "WarmupDecayLR", "params": {"total_num_steps": 30, "warmup_num_steps": 5,
                                               "warmup_max_lr": 0.1}}
    opt_a = adamw()
    a = build_lr_scheduler(cfg, opt_a)
    ref = lrs_after_steps(a, opt_a, 20)
    opt_b = adamw()
    b = build_lr_scheduler(cfg, opt_b)
    lrs_after_steps(b, opt_b, 8)
    opt_c = adamw()
    c = build_lr_scheduler(cfg, opt_c)
    c.load_state_dict(b.state_dict())
    assert opt_c.param_groups[0]["lr"] == pytest.approx(ref[8])   # restored position's lr written at once
    assert lrs_after_steps(c, opt_c, 12)[1:] == pytest.approx(ref[9:])
    with pytest.raises(KeyError, match="last_batch_iteration"):
        c.load_state_dict({})


def test_tensor_lr_stays_a_tensor():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.Adam([p], lr=torch.tensor(0.01))
    s = WarmupLR(opt, warmup_max_lr=0.1, warmup_num_steps=2, warmup_type="linear")
    s.step()
    s.step()
    assert torch.is_tensor(opt.param_groups[0]["lr"]) and float(opt.param_groups[0]["lr"]) == pytest.approx(0.05)


# ------------------------------------------------------------------------------------------------ build + errors
def test_build_none_and_every_type():
    assert build_lr_scheduler(None, adamw()) is None
    params = {"WarmupDecayLR": {"total_num_steps": 10}, "WarmupCosineLR": {"total_num_steps": 10},
              "OneCycle": {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1}}
    for name, cls in SCHEDULES.items():
        s = build_lr_scheduler({"type": name.lower(), "params": params.get(name, {})}, adamw())
        assert type(s) is cls and s.state_dict() == {"last_batch_iteration": -1}


def test_build_errors_name_the_key():
    with pytest.raises(DsConfigError, match=r"scheduler\.params\.total_num_steps: required key is missing"):
        build_lr_scheduler({"type": "WarmupDecayLR", "params": {}}, adamw())
    with pytest.raises(DsConfigError) as info:
        build_lr_scheduler({"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}, adamw())
    assert "scheduler.params.cycle_max_lr: required key is missing" in str(info.value)
    with pytest.raises(DsConfigError, match=r"scheduler\.params\.warmup_num_step: unknown key; did you mean "
                                            r"'warmup_num_steps'\?"):
        build_lr_scheduler({"type": "WarmupLR", "params": {"warmup_num_step": 10}}, adamw())
    with pytest.raises(DsConfigError, match=r"scheduler\.params\.warmup_num_steps"):
        build_lr_scheduler({"type": "WarmupLR", "params": {"warmup_num_steps": 0}}, adamw())
    with pytest.raises(DsConfigError, match=r"scheduler\.type"):
        build_lr_scheduler({"type": "StepLR"}, adamw())
    with pytest.raises(TypeError, match="param_groups"):
        build_lr_scheduler({"type": "WarmupLR"}, object())


def test_direct_construction_is_validated_too():
    with pytest.raises(DsConfigError, match=r"WarmupLR\.warmup_num_steps"):
        WarmupLR(adamw(), warmup_num_steps=0)
    with pytest.raises(DsConfigError, match=r"OneCycle\.cycle_first_step_size"):
        OneCycle(adamw(), 0.1, 1.0, cycle_first_step_size=0)


def test_constructor_defaults_equal_config_schema_defaults():
    for name, cls in SCHEDULES.items():
        model = SCHEDULER_PARAMS[name]
        sig = inspect.signature(cls.__init__)
        for key, field in model.model_fields.items():
            param = sig.parameters[key]
            if field.is_required():
                assert param.default is inspect.Parameter.empty, (name, key)
            else:
                assert param.default == field.default, (name, key)


# ------------------------------------------------------------------------------------------------ DeepSpeed
# Against DeepSpeed 0.19.8's traces recorded in tests/data (always), and a live DeepSpeed when importable.
def our_lr_trace(name, params):
    optimizer = lr_optimizer()
    return lr_trace(SCHEDULES[name](optimizer, **params), optimizer)


def assert_same_lr_trace(ours, theirs, case):
    assert len(ours["steps"]) == len(theirs["steps"]) == LR_STEPS
    for t, (a, b) in enumerate(zip(ours["steps"], theirs["steps"])):
        assert a["lr"] == pytest.approx(b["lr"], rel=1e-12, abs=1e-15), (case, t)
        assert a["beta1"] == pytest.approx(b["beta1"], rel=1e-12), (case, t)
    assert ours["state"] == theirs["state"], case


@pytest.mark.parametrize("name, params", LR_CASES, ids=[lr_case_id(*c) for c in LR_CASES])
def test_matches_deepspeed_recorded(name, params):
    case = lr_case_id(name, params)
    golden = load_golden("lr_schedules")[case]
    assert_same_lr_trace(our_lr_trace(name, params), golden, case)
    assert len({step["lr"][0] for step in golden["steps"]}) > 2, "a schedule that never moves proves nothing"


def test_every_recorded_schedule_is_a_case():
    assert sorted(load_golden("lr_schedules")) == sorted(lr_case_id(*c) for c in LR_CASES)


def test_matches_deepspeed_when_installed():
    deepspeed = pytest.importorskip("deepspeed")
    theirs = deepspeed_traces("lr_schedules")
    for name, params in LR_CASES:
        case = lr_case_id(name, params)
        assert_same_lr_trace(our_lr_trace(name, params), theirs[case], case)
    if deepspeed.__version__ == GOLDEN_DEEPSPEED:
        assert theirs == load_golden("lr_schedules"), "stale golden file: rerun tests/data/make_deepspeed_goldens.py"


def test_warmup_cosine_unknown_warmup_type_is_log_as_deepspeed():
    # DeepSpeed 0.19.8 warns and falls back to the log curve (tests/unit/runtime/test_lr_schedulers.py)
    def lrs(kind):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.001)
        s = WarmupCosineLR(opt, total_num_steps=100, warmup_num_steps=10, warmup_type=kind)
        out = []
        for step in range(15):
            s.step(step)
            out.append(opt.param_groups[0]["lr"])
        return s.warmup_type, out

    with pytest.warns(UserWarning, match="not_a_warmup_type"):
        kind, got = lrs("not_a_warmup_type")
    want_kind, want = lrs("log")
    assert kind == want_kind == "log" and got == want
    assert lrs("linear")[1] != want
