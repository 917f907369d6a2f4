"""offload_optimizer.state_precision "int8": the engine steps CPUAdam8bit on the host at stages 1-3 (cpu and nvme),
refuses it where it cannot apply, counts its bytes, and checkpoints the 8-bit moments as codes and scales, loading
them at another stage (a new block grid: re-quantized) and into / from fp32-state runs (converted, logged)."""
import pytest
import torch

import dsfast
from dsfast.config.loader import parse_config
from dsfast.ops.reference import adam8bit as Q
from dsfast.optim.cpu_adam8bit import CPUAdam8bit
from dsfast.utils import safe_get_full_optimizer_state
from dsfast.zero.planning.estimate import estimate_model_states, main as estimate_main
from dsfast.zero.policy.partition import model_state_bytes


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 300), torch.nn.GELU(), torch.nn.Linear(300, 8))


def _cfg(stage=2, precision="int8", device="cpu", nvme_path=None, **extra):
    off = {"device": device}
    if precision is not None:
        off["state_precision"] = precision
    if nvme_path:
        off["nvme_path"] = str(nvme_path)
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "zero_optimization": {"stage": stage, "offload_optimizer": off}}
    cfg.update(extra)
    return cfg


def _engine(cfg):
    model = _model()
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def _train(engine, steps, start=0):
    losses = []
    for i in range(start, start + steps):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def _within_half_gap(after, before, slack=1.0):
    """Re-quantized on another grid: each value moves by at most half a code step of its format (1/16 of the value:
    3 mantissa bits), or below the smallest code by at most that code (exp_avg: 2^-15 * 1.125 * absmax / 1.875;
    exp_avg_sq rounds up to it: 2^-31 * 1.125 * absmax / 1.875); a block may mix parameters, so its absmax is
    bounded by the largest value of that moment over the model."""
    for kind, smallest in (("exp_avg", 2.0 ** -15 * 0.6), ("exp_avg_sq", 2.0 ** -31 * 0.6)):
        top = max(t.abs().max().item() for (_, k), t in before.items() if k == kind)
        for key, want in before.items():
            if key[1] == kind:
                bound = (want.abs() / 16 + smallest * top) * slack * (1 + 1e-5)
                assert bool(((after[key] - want).abs() <= bound).all()), key


def _moments(engine):
    return {(n, k): safe_get_full_optimizer_state(p, k).clone() for n, p in engine.module.named_parameters()
            for k in ("exp_avg", "exp_avg_sq")}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_int8_states_train_at_every_stage_and_track_fp32(stage):
    q8, fp32 = _engine(_cfg(stage)), _engine(_cfg(stage, precision=None))
    assert isinstance(q8.optimizer, CPUAdam8bit) and not isinstance(fp32.optimizer, CPUAdam8bit)
    a, b = _train(q8, 12), _train(fp32, 12)
    # stated tolerance: every loss within 5% of the fp32-state run's (the moments' quantization error is ~1%)
    for x, y in zip(a, b):
        assert abs(x - y) <= 0.05 * y
    # host bytes: 2 code bytes a parameter plus 2 fp32 scales a block: memory_breakdown() and the estimator's
    # formula (python -m dsfast.zero.planning.estimate) agree up to the last block of each flat shard (8 bytes each)
    n = sum(p.numel() for p in q8.module.parameters())
    states = q8.memory_breakdown()["optimizer_states"]["host"]
    want = model_state_bytes(n, 1, stage, mixed=False, offload=True, states8=True)["host"]
    assert want == pytest.approx(2.03125 * n) and 0 <= states - want <= 8 * 8


def test_int8_states_on_nvme(tmp_path):
    engine = _engine(_cfg(2, device="nvme", nvme_path=tmp_path))
    assert isinstance(engine.optimizer, CPUAdam8bit)
    ref = _engine(_cfg(2))
    assert _train(engine, 4) == _train(ref, 4)   # the same kernel on the same values, swapped through files


@pytest.mark.parametrize("zero, match", [
    ({"stage": 2}, "needs ZeRO stage 1, 2 or 3 .* offload_optimizer.device"),
    ({"stage": 0, "offload_optimizer": {"device": "cpu", "state_precision": "int8"}}, "stage is 0"),
    ({"stage": 2, "offload_optimizer": {"device": "none", "state_precision": "int8"}},
     "bf16_optimizer_states .* AdamW8bit"),
])
def test_int8_refused_without_a_host_optimizer(zero, match):
    if "offload_optimizer" not in zero:
        zero = dict(zero, offload_optimizer={"device": "none", "state_precision": "8bit"})
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": zero}
    with pytest.raises(ValueError, match=match):
        parse_config(cfg)


def test_int8_refused_for_other_optimizers_and_bad_values():
    cfg = _cfg(2)
    cfg["optimizer"] = {"type": "SGD", "params": {"lr": 1e-3}}
    with pytest.raises(ValueError, match="Adam/AdamW"):
        parse_config(cfg)
    cfg = _cfg(2, precision="int4")
    with pytest.raises(ValueError, match="state_precision.*'fp32', 'int8'"):
        parse_config(cfg)


def test_explain_shows_the_key():
    from dsfast.config.explain import explain
    rows = {path: (value, origin) for path, value, origin in explain(_cfg(2))}
    value, origin = rows["zero_optimization.offload_optimizer.state_precision"]
    assert value == "int8" and origin == "user"
    rows = {path: (value, origin) for path, value, origin in explain(_cfg(2, precision=None))}
    value, origin = rows["zero_optimization.offload_optimizer.state_precision"]
    assert value == "fp32" and "dsfast's own key" in origin and "int8" in origin


def test_checkpoint_saves_codes_and_scales_and_resumes(tmp_path):
    engine = _engine(_cfg(2))
    _train(engine, 3)
    engine.save_checkpoint(str(tmp_path), tag="t")
    from safetensors import safe_open
    with safe_open(str(tmp_path / "t" / "optim_rank00000.safetensors"), "pt") as f:
        names = list(f.keys())
        codes = [f.get_tensor(k) for k in names if k.endswith("/exp_avg_codes")]
    assert codes and all(c.dtype == torch.uint8 for c in codes)
    assert any(k.endswith("/exp_avg_sq_scales") for k in names) and not any(k.endswith("/exp_avg") for k in names)
    before = _moments(engine)
    again = _engine(_cfg(2))
    again.load_checkpoint(str(tmp_path), tag="t")
    after = _moments(again)
    for key, want in before.items():   # the same block grid: the saved codes and scales, unchanged
        assert torch.equal(after[key], want), key
    assert _train(again, 2, start=3) == _train(engine, 2, start=3)


@pytest.mark.parametrize("save_stage, load_stage", [(2, 3), (3, 1)])
def test_checkpoint_loads_at_another_stage(tmp_path, save_stage, load_stage, capsys):
    engine = _engine(_cfg(save_stage))
    _train(engine, 3)
    engine.save_checkpoint(str(tmp_path), tag="t")
    before = _moments(engine)
    other = _engine(_cfg(load_stage))
    other.load_checkpoint(str(tmp_path), tag="t")
    assert "re-quantized" in capsys.readouterr().out
    _within_half_gap(_moments(other), before)


def test_checkpoint_converts_between_int8_and_fp32_runs(tmp_path, capsys):
    q8 = _engine(_cfg(2))
    _train(q8, 3)
    q8.save_checkpoint(str(tmp_path / "q"), tag="t")
    fp32 = _engine(_cfg(2, precision=None))
    fp32.load_checkpoint(str(tmp_path / "q"), tag="t")
    assert "exp_avg int8 -> float32" in capsys.readouterr().out
    for key, want in _moments(q8).items():   # dequantized: exactly the 8-bit run's values
        assert torch.equal(_moments(fp32)[key], want), key
    _train(fp32, 2, start=3)
    fp32.save_checkpoint(str(tmp_path / "f"), tag="t")
    back = _engine(_cfg(2))
    back.load_checkpoint(str(tmp_path / "f"), tag="t")
    assert "exp_avg float32 -> int8 (quantized)" in capsys.readouterr().out
    _within_half_gap(_moments(back), _moments(fp32))


def test_estimate_counts_int8_moments(capsys):
    rows = estimate_model_states(7e9, 8, states8=True)
    assert rows and all(r["offload_optimizer"] for r in rows)
    stage2 = next(r for r in rows if r["stage"] == 2)
    assert stage2["host"] == pytest.approx((4 + 2.03125) * 7e9 / 8)   # fp32 master + 8-bit moments
    estimate_main(["--params", "7e9", "--world-size", "8", "--int8-optimizer-states"])
    assert "int8 moments" in capsys.readouterr().out
    # on NVMe: the fp32 master and the 8-bit moments in the unit files; the host keeps the window of 4 units
    nvme = {r["stage"]: r for r in estimate_model_states(7e9, 8, states8=True, nvme=True, bucket=5e8)
            if r["offload_optimizer"] == "nvme" and not r["offload_param"]}
    assert nvme[2]["nvme"] == pytest.approx((4 + 2.03125) * 7e9 / 8, abs=1)
    assert nvme[2]["host"] == pytest.approx(stage2["host"] - (4 + 2.03125) * 7e9 / 8 +
                                            4 * (4 + 2.03125) * (5e8 // 8 + 1), abs=4 * 4096)   # page-aligned
    with pytest.raises(ValueError, match="offload_optimizer"):
        model_state_bytes(100, 1, 2, True, offload=False, states8=True)


def test_checkpoint_from_two_ranks_loads_on_one_rank_at_stage_3(tmp_path, capsys):
    import os
    import sys
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed")
    sys.path.insert(0, here)
    from dist_launch import launch
    launch(os.path.join(here, "worker_int8_states.py"), [tmp_path], nprocs=2, timeout=120)
    saved = torch.load(tmp_path / "moments.pt")
    one = _engine(_cfg(3))
    one.load_checkpoint(str(tmp_path), tag="t")
    assert "re-quantized" in capsys.readouterr().out     # rank 1's shard started mid-block: the grid moved
    _within_half_gap(_moments(one), saved)


def test_bf16_masters_with_int8_states():
    bf16 = {"enabled": True, "bf16_master_weights_and_grads": True}
    runs = []
    for precision in ("int8", None):
        engine = _engine(_cfg(2, precision=precision, bf16=bf16))
        assert isinstance(engine.optimizer, CPUAdam8bit) == (precision == "int8")
        losses = []
        for i in range(8):
            g = torch.Generator().manual_seed(i)
            x, y = torch.randn(4, 16, generator=g).bfloat16(), torch.randn(4, 8, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        runs.append(losses)
    for x, y in zip(*runs):   # stated: within 5% of the bf16-master, fp32-moment run
        assert abs(x - y) <= 0.05 * y


def test_checkpoint_with_int8_states_on_nvme_loads_at_another_stage(tmp_path):
    for d in ("swap", "swap2", "swap3"):
        (tmp_path / d).mkdir()
    engine = _engine(_cfg(2, device="nvme", nvme_path=tmp_path / "swap"))
    _train(engine, 3)
    engine.save_checkpoint(str(tmp_path / "ckpt"), tag="t")
    before = _moments(engine)
    same = _engine(_cfg(2, device="nvme", nvme_path=tmp_path / "swap2"))
    same.load_checkpoint(str(tmp_path / "ckpt"), tag="t")
    for key, want in _moments(same).items():
        assert torch.equal(want, before[key]), key
    other = _engine(_cfg(3, device="nvme", nvme_path=tmp_path / "swap3"))
    other.load_checkpoint(str(tmp_path / "ckpt"), tag="t")
    _within_half_gap(_moments(other), before)
    assert _train(same, 2, start=3) == _train(engine, 2, start=3)


@pytest.mark.parametrize("stage, device", [(2, "cpu"), (3, "cpu"), (2, "nvme")])
def test_a_deepspeed_checkpoint_loads_into_an_int8_run(stage, device, capsys, tmp_path):
    """DeepSpeed 0.19.8's fp32 moments (tests/data/deepspeed_ckpt, 2 ranks) into a 1-rank int8 offload run: quantized
    on this run's blocks (logged), each value within half a code step of DeepSpeed's. On NVMe too: each unit's states
    read, filled and written back (they crashed the load before, swapped out)."""
    import os
    from dsfast.checkpoint.deepspeed_import import DeepSpeedCheckpoint
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "deepspeed_ckpt", f"stage{stage}_fp32")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.LayerNorm(10), torch.nn.Linear(10, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": stage, "offload_optimizer": {"device": device, "state_precision": "int8"}}}
    if device == "nvme":
        cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = str(tmp_path)
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    engine.load_checkpoint(folder)
    assert "exp_avg float32 -> int8 (quantized)" in capsys.readouterr().out
    ds = DeepSpeedCheckpoint(os.path.join(folder, "global_step2"))
    want = {(n, k): ds.tensor(n, k).reshape(p.shape) for n, p in engine.module.named_parameters()
            for k in ("exp_avg", "exp_avg_sq")}
    _within_half_gap(_moments(engine), want)
    engine.backward(torch.nn.functional.mse_loss(engine(torch.ones(2, 6)).float(), torch.zeros(2, 3)))
    engine.step()
    assert engine.global_steps == 3


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_optimizer_state_setters_write_int8_moments(device, tmp_path):
    """safe_set_full / safe_set_local_optimizer_state on 8-bit moments (DeepSpeed's API): the blocks the parameter
    touches are quantized again with the new values, each within half a code step; training goes on."""
    from dsfast.utils import safe_set_full_optimizer_state, safe_set_local_optimizer_state
    engine = _engine(_cfg(2, device=device, nvme_path=tmp_path if device == "nvme" else None))
    _train(engine, 2)
    before = _moments(engine)
    params = dict(engine.module.named_parameters())
    want = dict(before)
    for (name, key), value in before.items():
        if name == "0.weight":
            want[(name, key)] = value * 3
            safe_set_full_optimizer_state(params[name], value * 3, key)
        elif name == "2.bias":   # one rank: the local piece is the whole parameter, flat
            want[(name, key)] = value.abs() + 1e-4
            safe_set_local_optimizer_state(params[name], (value.abs() + 1e-4).reshape(-1), key)
    _within_half_gap(_moments(engine), want)   # the neighbours sharing a block: rounded once more
    _train(engine, 1, start=2)
