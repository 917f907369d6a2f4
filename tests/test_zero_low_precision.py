"""16-bit masters and optimizer states at ZeRO stages 1-3 in one process (tests/distributed/
test_zero_low_precision_dp.py runs them on 2 and 4 ranks): one answer across stages and offload, no fp32 copy of the
masters or moments, DeepSpeed 0.19.8's optimizer rules at initialize, the memory formulas and estimate rows."""
import pytest
import torch

import dsfast
from dsfast.zero.policy.precision import PrecisionError
from test_zero_engine import _cfg, _model, _train

PLACES = [(1, False), (1, True), (2, False), (2, True), (3, False), (3, True)]


def _low(stage, offload, states=True, precision="bf16", optimizer=None):
    cfg = _cfg(stage, precision, offload)
    if precision == "bf16":
        cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=states)
    else:
        cfg["fp16"]["fp16_master_weights_and_grads"] = True
    if optimizer is not None:
        cfg["optimizer"] = optimizer
    return cfg


def _params(engine):
    return [p.detach().float().clone() for p in engine.module.parameters()]


def _owned_floats(engine):
    return [t for ts in engine.state_owner.memory_tensors().values() for t in ts
            if torch.is_tensor(t) and t.is_floating_point() and t.numel() > 1]


@pytest.mark.parametrize("placement", ["", "distinct-host"])
def test_every_stage_and_offload_give_one_answer_in_16_bits(monkeypatch, placement):
    if placement:
        monkeypatch.setenv("DSFAST_TEST_PLACEMENT", placement)
    runs = {}
    for stage, offload in PLACES:
        engine = _train(_low(stage, offload))
        runs[(stage, offload)] = _params(engine)
        shards = [p for g in engine.optimizer.param_groups for p in g["params"]]
        states = [t for s in shards for t in (engine.optimizer.state[s]["exp_avg"],
                                              engine.optimizer.state[s]["exp_avg_sq"])]
        assert {s.dtype for s in shards} == {torch.bfloat16} and {t.dtype for t in states} == {torch.bfloat16}
        # nothing the owner keeps is fp32: no master, moment or gradient was widened on the way
        assert {t.dtype for t in _owned_floats(engine)} == {torch.bfloat16}, (stage, offload)
    first = runs[(1, False)]
    for key, got in runs.items():
        for a, b in zip(got, first):
            assert torch.equal(a, b), key


def test_16bit_masters_stay_within_bf16_noise_of_fp32_masters():
    ref = _params(_train(_cfg(2, "bf16"), steps=8))
    for cfg in (_low(2, False), _low(2, True, states=False)):
        got = _params(_train(cfg, steps=8))
        x, y = torch.cat([t.flatten() for t in got]), torch.cat([t.flatten() for t in ref])
        dist = float((x - y).norm() / y.norm())
        assert 0 < dist < 2e-2, dist   # not identical (the masters are rounded), but close


def test_fp32_states_beside_bf16_masters_with_offload():
    engine = _train(_low(2, True, states=False))
    opt = engine.optimizer
    s = opt.param_groups[0]["params"][0]
    assert type(opt).__name__ == "CPUAdam" and opt.fp32_optimizer_states
    assert s.dtype == torch.bfloat16 and opt.state[s]["exp_avg"].dtype == torch.float32


def test_fp16_masters_with_offload_train_as_fp16_with_fp32_masters():
    ref = _params(_train(_cfg(2, "fp16", True), steps=6))
    engine = _train(_low(2, True, precision="fp16"), steps=6)
    s = engine.optimizer.param_groups[0]["params"][0]
    assert s.dtype == torch.float16 and engine.optimizer.state[s]["exp_avg"].dtype == torch.float32
    got = _params(engine)
    x, y = torch.cat([t.flatten() for t in got]), torch.cat([t.flatten() for t in ref])
    assert float((x - y).norm() / y.norm()) < 5e-3


def _init(cfg, optimizer=None):
    model = _model()
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg, optimizer=optimizer,
                             dist_init_required=False)[0]


def test_initialize_refuses_what_deepspeed_refuses():
    # fp32 moments beside bf16 masters (offload): DeepSpeedCPUAdam only
    cfg = _low(2, True, states=False)
    del cfg["optimizer"]
    cfg["zero_force_ds_cpu_optimizer"] = False    # else the client optimizer under offload is refused first
    model = _model()
    with pytest.raises(PrecisionError, match=r"bf16_master_weights_and_grads=true needs ZeRO-Offload .*CPUAdam.*AdamW"):
        dsfast.initialize(model=model, config=cfg, optimizer=torch.optim.AdamW(model.parameters()),
                          dist_init_required=False)
    # offloaded bf16 moments: not SGD either (DeepSpeed: type(optimizer) == DeepSpeedCPUAdam)
    with pytest.raises(PrecisionError, match="CPUSGD"):
        _init(_low(2, True, optimizer={"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}))
    # a client CPUAdam keeping fp32 moments cannot hold bf16_optimizer_states on the host
    cfg = _low(3, True)
    del cfg["optimizer"]
    model = _model()
    with pytest.raises(PrecisionError, match="fp32_optimizer_states=False"):
        dsfast.initialize(model=model, config=cfg, optimizer=dsfast.optim.CPUAdam(model.parameters()),
                          dist_init_required=False)
    # fp16 masters: offload and CPUAdam
    cfg = _low(1, True, precision="fp16")
    del cfg["optimizer"]
    cfg["zero_force_ds_cpu_optimizer"] = False
    model = _model()
    with pytest.raises(PrecisionError, match="fp16_master_weights_and_grads=true needs"):
        dsfast.initialize(model=model, config=cfg, optimizer=torch.optim.Adam(model.parameters()),
                          dist_init_required=False)


@pytest.mark.parametrize("make", [lambda ps: torch.optim.AdamW(ps, lr=1e-2),
                                  lambda ps: dsfast.optim.FusedAdam(ps, lr=1e-2)], ids=["torch", "FusedAdam"])
def test_any_optimizer_holds_bf16_moments_on_the_device(make):
    """No offload: the optimizer steps the bf16 shards and keeps its moments in their dtype (FusedAdam here runs its
    reference kernel on CPU tensors; the CUDA kernel's bf16 params + bf16 moments run under the emulator in
    tests/test_cuda_emulator.py)."""
    cfg = _low(2, False)
    del cfg["optimizer"]
    model = _model()
    engine = dsfast.initialize(model=model, config=cfg, optimizer=make(model.parameters()),
                               dist_init_required=False)[0]
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
    engine.step()
    s = engine.optimizer.param_groups[0]["params"][0]
    assert s.dtype == torch.bfloat16 and engine.optimizer.state[s]["exp_avg"].dtype == torch.bfloat16


def test_estimate_rows_and_formula_errors(capsys):
    from dsfast.zero import estimate_model_states, model_state_bytes
    from dsfast.zero.planning.estimate import main
    psi, n = 7 * 10 ** 9, 8
    rows = estimate_model_states(psi, n, master16=True, states16=True)
    assert {r["stage"] for r in rows} == {1, 2, 3}
    by = {(r["stage"], r["offload_optimizer"], r["offload_param"]): r for r in rows}
    assert by[(1, False, False)]["device"] == 4 * psi + 4 * psi / n
    assert by[(2, False, False)]["device"] == 2 * psi + 6 * psi / n
    assert by[(3, False, False)]["device"] == 8 * psi / n
    assert by[(2, True, False)]["host"] == 6 * psi / n          # bf16 master + bf16 m, v: 6 bytes, not 12
    assert model_state_bytes(psi, n, 2, True, True)["host"] == 12 * psi / n
    assert model_state_bytes(psi, n, 2, True, True, master16=True)["host"] == 10 * psi / n
    only_offload = estimate_model_states(psi, n, master16=True)   # fp32 moments: DeepSpeed needs offload
    assert all(r["offload_optimizer"] for r in only_offload)
    with pytest.raises(ValueError, match="16-bit model"):
        model_state_bytes(psi, n, 0, True, master16=True)
    with pytest.raises(ValueError, match="bf16_optimizer_states needs"):
        model_state_bytes(psi, n, 2, True, states16=True)
    with pytest.raises(ValueError, match="not --fp32"):
        estimate_model_states(psi, n, mixed=False, master16=True)
    with pytest.raises(ValueError, match="NVMe are not supported"):
        estimate_model_states(psi, n, master16=True, states16=True, nvme=True)
    main(["--params", "7e9", "--world-size", "8", "--bf16-master", "--bf16-optimizer-states"])
    assert "bf16 masters, Adam with bf16 moments" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--params", "7e9", "--world-size", "8", "--bf16-optimizer-states"])
    assert "needs --bf16-master" in capsys.readouterr().err


def test_policy_refuses_16bit_masters_of_another_dtype_or_stage():
    from dsfast.zero.policy.precision import precision_policy
    assert precision_policy("bf16", 2, master="bf16").master_dtype == torch.bfloat16
    with pytest.raises(PrecisionError, match="stage 1-3 and a bf16 model"):
        precision_policy("fp16", 2, master="bf16")
    with pytest.raises(PrecisionError, match="stage 0"):
        precision_policy("bf16", 0, master="bf16")


def test_checkpoint_state_dtype_follows_the_optimizer_not_the_file():
    from dsfast.checkpoint.shards import state_dtype
    bf16 = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    f32 = torch.nn.Parameter(torch.zeros(4))
    assert state_dtype(dsfast.optim.CPUAdam([bf16]), bf16, torch.bfloat16) == torch.float32   # fp32 moments
    assert state_dtype(dsfast.optim.CPUAdam([bf16], fp32_optimizer_states=False), bf16, torch.float32) == \
        torch.bfloat16
    assert state_dtype(dsfast.optim.CPUAdam([f32], fp32_optimizer_states=False), f32, torch.bfloat16) == \
        torch.float32
    assert state_dtype(torch.optim.AdamW([bf16]), bf16, torch.float32) == torch.bfloat16     # torch: the param's
    assert state_dtype(torch.optim.AdamW([f32]), f32, torch.int64) == torch.int64             # not a float: kept
