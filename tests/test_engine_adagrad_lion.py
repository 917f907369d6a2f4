"""The config's "Adagrad" and "Lion" optimizer types and DeepSpeedCPUAdagrad / DeepSpeedCPULion as client optimizers,
in one process: built as DeepSpeed 0.19.8's engine builds them (_configure_basic_optimizer: the CPU classes under
offload_optimizer, torch.optim.Adagrad for Adagrad on the GPU, FusedLion for Lion on the GPU, which dsfast lacks), and
training as a plain torch loop with torch.optim.Adagrad / the Lion paper's update does."""
import pytest
import torch

import dsfast
from dsfast.config import DsConfigError, load_config
from dsfast.engine.optimizer_factory import OptimizerConfigError, build_optimizer
from dsfast.ops.adagrad import DeepSpeedCPUAdagrad
from dsfast.ops.lion import DeepSpeedCPULion
from dsfast.optim import CPUAdagrad, CPULion
from dsfast.utils import safe_get_full_fp32_param
from test_cpu_optim_adagrad_lion import PaperLion

STEPS = 5
OPTIMIZERS = {
    "Adagrad": (dict(lr=0.05, weight_decay=0.01), CPUAdagrad,
                lambda ps: torch.optim.Adagrad(ps, lr=0.05, weight_decay=0.01)),
    "Lion": (dict(lr=1e-3, betas=[0.9, 0.99], weight_decay=0.1), CPULion,
             lambda ps: PaperLion(ps, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)) for _ in range(STEPS)]


def _cfg(kind, stage, offload, precision="fp32"):
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000, "gradient_clipping": 0.0,
           "optimizer": {"type": kind, "params": dict(OPTIMIZERS[kind][0])},
           "zero_optimization": {"stage": stage}}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def _train(cfg, optimizer=None):
    model = _model()
    if callable(optimizer):
        optimizer = optimizer(model.parameters())
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg, optimizer=optimizer,
                               dist_init_required=False)[0]
    for x, y in _batches():
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()
    return engine


def _torch_loop(kind):
    model = _model()
    opt = OPTIMIZERS[kind][2](list(model.parameters()))
    for x, y in _batches():
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


@pytest.mark.parametrize("kind", ["Adagrad", "Lion"])
@pytest.mark.parametrize("stage,offload", [(0, False), (2, True), (3, True)])
def test_config_type_trains_as_the_torch_optimizer(kind, stage, offload):
    engine = _train(_cfg(kind, stage, offload))
    assert type(engine.optimizer) is OPTIMIZERS[kind][1]
    ref = _torch_loop(kind)
    for (name, p), q in zip(engine.module.named_parameters(), ref.parameters()):
        got = safe_get_full_fp32_param(p) if stage == 3 else p.detach()
        torch.testing.assert_close(got, q.detach(), rtol=1e-5, atol=1e-6, msg=lambda m: f"{kind} {name}: {m}")


@pytest.mark.parametrize("kind,cls", [("Adagrad", DeepSpeedCPUAdagrad), ("Lion", DeepSpeedCPULion)])
def test_client_optimizer_under_offload_matches_the_config_one(kind, cls):
    cfg = _cfg(kind, 2, True)
    if kind == "Adagrad":   # DeepSpeed 0.19.8 takes only its CPU Adam and Lion as client optimizers under offload
        cfg["zero_force_ds_cpu_optimizer"] = False
    kw = dict(cfg.pop("optimizer")["params"])
    if "betas" in kw:
        kw["betas"] = tuple(kw["betas"])
    got = _train(cfg, optimizer=lambda ps: cls(ps, **kw))
    assert type(got.optimizer) is cls
    ref = _train(_cfg(kind, 2, True))
    for p, q in zip(got.module.parameters(), ref.module.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("kind", ["Adagrad", "Lion"])
def test_bf16_with_offload_keeps_the_params_the_rounded_masters(kind):
    """bf16 training under offload: fp32 masters on the host, stepped by the CPU class, whose fused 16-bit output
    writes the bf16 parameters in the same pass."""
    engine = _train(_cfg(kind, 2, True, precision="bf16"))
    assert type(engine.optimizer) is OPTIMIZERS[kind][1]
    initial = _model()
    for p, p0 in zip(engine.module.parameters(), initial.parameters()):
        master = safe_get_full_fp32_param(p)
        assert p.dtype == torch.bfloat16 and master.dtype == torch.float32
        assert torch.equal(p.detach(), master.to(torch.bfloat16))
        assert not torch.equal(master, p0.detach())


def test_config_params_reach_the_classes():
    cfg = _cfg("Lion", 2, True)
    cfg["optimizer"]["params"]["fp32_optimizer_states"] = False
    engine = _train(cfg)
    group = engine.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.99) and group["lr"] == 1e-3 and group["weight_decay"] == 0.1
    assert engine.optimizer.fp32_optimizer_states is False
    ada = _train({**_cfg("Adagrad", 2, True), "optimizer": {"type": "adagrad", "params": {"eps": 1e-6}}}).optimizer
    assert ada.param_groups[0]["eps"] == 1e-6 and ada.param_groups[0]["lr"] == 1e-2   # DeepSpeedCPUAdagrad's default


def _groups():
    return [{"params": [torch.nn.Parameter(torch.zeros(3))]}]


def test_on_the_gpu_adagrad_is_torch_s_and_lion_is_refused_naming_offload():
    adagrad = load_config(_cfg("Adagrad", 0, False)).optimizer
    opt = build_optimizer(adagrad, _groups(), "cuda")
    assert type(opt) is torch.optim.Adagrad and opt.defaults["lr"] == 0.05 and opt.defaults["eps"] == 1e-10
    lion = load_config(_cfg("Lion", 0, False)).optimizer
    with pytest.raises(OptimizerConfigError, match="FusedLion.*offload_optimizer"):
        build_optimizer(lion, _groups(), "cuda")


def test_a_torch_adagrad_key_the_cpu_class_lacks_is_refused_by_name():
    opt_cfg = load_config({**_cfg("Adagrad", 2, True), "optimizer": {"type": "Adagrad",
                                                                      "params": {"lr_decay": 0.1}}}).optimizer
    with pytest.raises(OptimizerConfigError, match=r"optimizer\.params\.lr_decay=0\.1.*CPUAdagrad"):
        build_optimizer(opt_cfg, _groups(), "cpu")
    assert type(build_optimizer(opt_cfg, _groups(), "cuda")) is torch.optim.Adagrad   # torch's takes it


@pytest.mark.parametrize("kind,params,path,text", [
    ("Adagrad", {"eps": 0}, "optimizer.params.eps", "greater than 0"),
    ("Adagrad", {"lr": -1}, "optimizer.params.lr", ""),
    ("Adagrad", {"weight_decay": -0.1}, "optimizer.params.weight_decay", ""),
    ("Adagrad", {"amsgrad": True}, "optimizer.params.amsgrad", "no meaning for Adagrad"),
    ("Adagrad", {"momentum": 0.9}, "optimizer.params.momentum", ""),
    ("Lion", {"betas": [0.9, 1.2]}, "optimizer.params.betas", "[0, 1)"),
    ("Lion", {"betas": [0.9]}, "optimizer.params.betas", "two numbers"),
    ("Lion", {"eps": 1e-8}, "optimizer.params.eps", ""),
    ("Lion", {"weight_decay": float("nan")}, "optimizer.params.weight_decay", ""),
])
def test_bad_config_params_name_the_key(kind, params, path, text):
    with pytest.raises(DsConfigError) as e:
        load_config({"train_batch_size": 8, "optimizer": {"type": kind, "params": params}})
    assert path in str(e.value) and text in str(e.value), str(e.value)


def test_both_step_one_nvme_unit_at_a_time_and_budget_one_state():
    from dsfast.optim.element_wise import states_per_element
    from dsfast.zero.nvme.states import check_unit_by_unit
    for opt in (CPUAdagrad(_groups()), CPULion(_groups())):
        check_unit_by_unit(opt)   # element-wise: accepted
        assert states_per_element(opt) == 1


@pytest.mark.parametrize("kind", ["Adagrad", "Lion"])
def test_nvme_offload_steps_unit_by_unit_bitwise_as_cpu_offload(kind, tmp_path):
    """Declared element-wise, they step one NVMe unit at a time; the result is the CPU offload's, bit for bit."""
    def cfg(offload):
        c = _cfg(kind, 2, True)
        c["zero_optimization"]["reduce_bucket_size"] = 300   # 3 units: each really swaps
        c["zero_optimization"]["offload_optimizer"] = offload
        return c
    ref = _train(cfg({"device": "cpu"}))
    got = _train(cfg({"device": "nvme", "nvme_path": str(tmp_path), "buffer_count": 3}))
    assert type(got.optimizer) is OPTIMIZERS[kind][1] and len(got.state_owner.swap.units) == 3
    key = OPTIMIZERS[kind][1].STATE_KEY
    for u in got.state_owner.swap.units:
        assert sorted(got.optimizer.state[u.shard]) == sorted([key, "step"])
    for p, q in zip(got.module.parameters(), ref.module.parameters()):
        assert torch.equal(p, q)
    got.destroy()


@pytest.mark.parametrize("kind", ["Adagrad", "Lion"])
def test_checkpoint_round_trip_resumes_bitwise(kind, tmp_path):
    from dsfast.utils import safe_get_full_optimizer_state
    whole = _train(_cfg(kind, 2, True))                      # STEPS steps straight
    model = _model()
    first = dsfast.initialize(model=model, model_parameters=model.parameters(), config=_cfg(kind, 2, True),
                              dist_init_required=False)[0]
    batches = _batches()
    for x, y in batches[:2]:
        first.backward(torch.nn.functional.mse_loss(first(x), y))
        first.step()
    first.save_checkpoint(str(tmp_path), tag="t")
    model = _model()
    resumed = dsfast.initialize(model=model, model_parameters=model.parameters(), config=_cfg(kind, 2, True),
                                dist_init_required=False)[0]
    resumed.load_checkpoint(str(tmp_path), tag="t")
    for x, y in batches[2:]:
        resumed.backward(torch.nn.functional.mse_loss(resumed(x), y))
        resumed.step()
    key = OPTIMIZERS[kind][1].STATE_KEY
    for p, q in zip(resumed.module.parameters(), whole.module.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(safe_get_full_optimizer_state(p, key), safe_get_full_optimizer_state(q, key))
    shards = [(a, b) for ga, gb in zip(resumed.optimizer.param_groups, whole.optimizer.param_groups)
              for a, b in zip(ga["params"], gb["params"])]
    assert shards and all(float(resumed.optimizer.state[a]["step"]) == float(whole.optimizer.state[b]["step"]) == STEPS
                          for a, b in shards)


def test_config_defaults_listing_shows_their_params(capsys):
    from dsfast.config.__main__ import main
    assert main(["--defaults"]) == 0
    out = capsys.readouterr().out
    assert 'optimizer.params ("type": "Adagrad") eps = 1e-10  [> 0]' in out
    assert 'optimizer.params ("type": "Lion") betas = (0.9, 0.999)' in out
