"""ZeRO stage 3's user API in one process: zero.Init, save_16bit_model, the memory estimate (function and CLI)."""
import subprocess
import sys

import pytest
import torch

import dsfast
from dsfast.utils import safe_get_full_fp32_param
from dsfast.checkpoint.safetensors_io import read_file as load_safetensors
from test_zero3_engine import _cfg3
from test_zero_engine import _model, _train


def test_zero_init_is_reachable_as_deepspeed_zero_init_and_partitions_as_modules_are_built():
    import dsfast as deepspeed
    assert deepspeed.zero.Init is dsfast.zero.Init and deepspeed.zero.GatheredParameters
    want = _model()
    with deepspeed.zero.Init(config_dict_or_path=_cfg3()):
        model = _model()
        assert model[0].weight.numel() == 0 and model[0].weight.ds_shape == (33, 16)
    assert torch.nn.Linear(2, 2).weight.numel() == 4          # outside the context modules are ordinary again
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=_cfg3(),
                               dist_init_required=False)[0]
    for p, w in zip(model.parameters(), want.parameters()):
        assert torch.equal(safe_get_full_fp32_param(p), w.detach())
    ref = _train(_cfg3(), steps=3)
    got = _train(_cfg3(), steps=3, model=engine.module)   # a second initialize adopts the partitions
    for a, b in zip(got.module.parameters(), ref.module.parameters()):
        torch.testing.assert_close(safe_get_full_fp32_param(a), safe_get_full_fp32_param(b), atol=1e-6, rtol=0)


def test_zero_init_offload_param_from_the_config_puts_shards_on_the_host():
    cfg = _cfg3(offload_param=True)
    with dsfast.zero.Init(config_dict_or_path=cfg):
        model = _model()
    assert model[0].weight._dsfast_z3.shard.device.type == "cpu"


def test_zero_init_with_nvme_builds_in_host_memory_and_initialize_swaps(tmp_path):
    # DeepSpeed's remote_device="nvme" (or offload_param.device "nvme" in the config): dsfast builds the partitions
    # in host memory, and initialize() moves them to their swap files
    cfg = _cfg3()
    cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": str(tmp_path), "max_in_cpu": 0}
    for kwargs in ({"remote_device": "nvme"}, {"config_dict_or_path": cfg}):
        with dsfast.zero.Init(**kwargs):
            model = _model()
        assert model[0].weight._dsfast_z3.shard.device.type == "cpu"
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    assert model[0].weight._dsfast_z3.swap is engine.state_owner.param_swap
    assert model[0].weight.ds_tensor.untyped_storage().nbytes() == 0   # in its file


def test_zero_init_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match=r"remote_device='disk'.*valid are None \(the device\), \"cpu\" and \"nvme\""):
        dsfast.zero.Init(remote_device="disk")
    with pytest.raises(NotImplementedError, match="mpu"):
        dsfast.zero.Init(mpu=object())
    with dsfast.zero.Init():
        model = _model()
    model[0].weight._dsfast_z3.world = 2          # as if partitioned for another world size
    with pytest.raises(RuntimeError, match="partitioned by dsfast.zero.Init for rank 0 of 2, but initialize"):
        dsfast.initialize(model=model, model_parameters=model.parameters(), config=_cfg3(),
                          dist_init_required=False)


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin"])
def test_save_16bit_model_writes_the_whole_weights(tmp_path, name):
    cfg = _cfg3("bf16", gather_16bit_weights_on_model_save=True)
    engine = _train(cfg, steps=2)
    assert engine.save_16bit_model(str(tmp_path), name) is True
    sd = load_safetensors(tmp_path / name) if name.endswith(".safetensors") else torch.load(tmp_path / name)
    with dsfast.zero.GatheredParameters(engine.module.parameters()):
        want = engine.module.state_dict()
        assert set(sd) == set(want)
        for k, v in want.items():
            assert sd[k].dtype == torch.bfloat16 and torch.equal(sd[k], v), k
    assert all(p.numel() == 0 for p in engine.module.parameters())   # released again


def test_save_16bit_model_at_stage3_needs_the_gather_flag(tmp_path, capsys):
    engine = _train(_cfg3(), steps=1)
    assert engine.save_16bit_model(str(tmp_path), "model.safetensors") is False
    assert "gather_16bit_weights_on_model_save" in capsys.readouterr().out
    assert not (tmp_path / "model.safetensors").exists()


def test_save_16bit_model_at_stage0_and_tied_weights(tmp_path):
    engine = _train(_cfg(0), steps=1)
    engine.save_16bit_model(str(tmp_path), "m.safetensors")
    sd = load_safetensors(tmp_path / "m.safetensors")
    for k, v in engine.module.state_dict().items():
        assert torch.equal(sd[k], v)


def _cfg(stage, **kw):
    from test_zero_engine import _cfg as cfg
    return cfg(stage, **kw)


def test_estimate_is_the_formulas_the_memory_tests_check():
    from dsfast.zero import estimate_model_states, model_state_bytes
    rows = estimate_model_states(7e9, 8)
    by = {(r["stage"], r["offload_optimizer"], r["offload_param"]): r for r in rows}
    assert len(rows) == 9
    assert by[(3, False, False)]["device"] == 16 * 7e9 / 8 and by[(3, False, False)]["host"] == 0
    assert by[(3, True, True)] == {"stage": 3, "offload_optimizer": True, "offload_param": True,
                                   "device": 2 * 7e9 / 8, "host": 14 * 7e9 / 8}
    assert by[(2, True, False)]["device"] == model_state_bytes(7e9, 8, 2, True, True)["device"] == 2 * 7e9 + 2 * 7e9 / 8
    fp32 = estimate_model_states(1000, 4, mixed=False, largest_layer=100)
    assert [r for r in fp32 if r["stage"] == 3 and not r["offload_optimizer"] and not r["offload_param"]][0][
        "device"] == 16 * 1000 / 4 + 4 * 100
    assert all(r["offload_optimizer"] or r["offload_param"] for r in estimate_model_states(1e9, 2, offload=True))
    with pytest.raises(ValueError, match="offload_param needs ZeRO stage 3"):
        model_state_bytes(10, 2, 2, True, offload_param=True)


def test_estimate_cli():
    run = subprocess.run([sys.executable, "-m", "dsfast.zero.planning.estimate", "--params", "7e9",
                          "--world-size", "8"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    line = [ln.split() for ln in run.stdout.splitlines() if ln.split()[:3] == ["3", "False", "False"]][0]
    assert float(line[3]) == pytest.approx(16 * 7e9 / 8 / 2**30, abs=0.01)
    bad = subprocess.run([sys.executable, "-m", "dsfast.zero.planning.estimate", "--params", "0", "--world-size", "8"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "params and world_size must be >= 1" in bad.stderr


def test_partitioned_parameters_carry_deepspeed_s_attributes_as_their_state_changes():
    # programs written for DeepSpeed tell a partitioned parameter by hasattr(p, "ds_id") and gather it when
    # p.ds_status is NOT_AVAILABLE (DeepSpeed-Chat's save and EMA helpers); without them they save empty tensors
    from dsfast.runtime.zero.partition_parameters import ZeroParamStatus
    assert ZeroParamStatus is dsfast.zero.ZeroParamStatus
    engine = _train(_cfg3(), steps=2)
    params = list(engine.module.parameters())
    assert len({p.ds_id for p in params}) == len(params)
    for p in params:
        rec = p._dsfast_z3
        assert p.ds_status is ZeroParamStatus.NOT_AVAILABLE and p.numel() == 0
        assert p.ds_tensor is rec.shard and p.ds_tensor.numel() == rec.shard_numel and p.ds_persist is False
        assert p.ds_numel == rec.numel and tuple(p.ds_shape) == rec.shape
    seen = []
    hook = engine.module[0].register_forward_hook(lambda m, i, o: seen.append(m.weight.ds_status))
    engine(torch.randn(4, 16))
    hook.remove()
    assert seen == [ZeroParamStatus.AVAILABLE] and params[0].ds_status is ZeroParamStatus.NOT_AVAILABLE

    def to_fetch(ps):   # DeepSpeed-Chat's _z3_params_to_fetch, verbatim in spirit
        return [p for p in ps if hasattr(p, "ds_id") and p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
    saved = {}
    for name, p in engine.module.named_parameters():
        with dsfast.zero.GatheredParameters(to_fetch([p]), enabled=True):
            assert p.ds_status is ZeroParamStatus.AVAILABLE
            saved[name] = p.data.clone()
    for name, p in engine.module.named_parameters():
        assert torch.equal(saved[name], safe_get_full_fp32_param(p).to(saved[name].dtype)), name
    cfg = _cfg3()
    cfg["zero_optimization"]["param_persistence_threshold"] = 10 ** 9        # every parameter persistent
    small = _train(cfg, steps=1)
    assert all(p.ds_persist and p.ds_status is ZeroParamStatus.AVAILABLE for p in small.module.parameters())


def test_zero_init_joins_the_process_group_a_launcher_describes_even_of_one_rank():
    # DeepSpeed's Init calls init_distributed() (its test_scattered_init_dist: a serial torchrun-style environment);
    # without launcher variables there is no group to join and none is made
    import os
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import torch, torch.distributed as dist, dsfast\n"
            "assert not dist.is_initialized()\n"
            "with dsfast.zero.Init():\n"
            "    m = torch.nn.Linear(4, 4)\n"
            "print(dist.is_initialized(), m.weight.ds_numel)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "SLURM_")) and k not in
           ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    launched = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(
        env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    assert launched.stdout.split() == ["True", "16"], launched.stderr[-2000:]
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert plain.stdout.split() == ["False", "16"], plain.stderr[-2000:]
