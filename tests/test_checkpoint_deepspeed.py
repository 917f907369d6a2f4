"""DeepSpeed 0.19.8 checkpoints (tests/data/deepspeed_ckpt, written by make_checkpoints.py with real DeepSpeed on
2 CPU ranks) read without DeepSpeed and without running pickled code."""
import os
import pickle

import pytest
import torch

import dsfast
from dsfast.checkpoint import CheckpointCorruptError, consolidate
from dsfast.checkpoint.deepspeed_import import DeepSpeedCheckpoint, convert
from dsfast.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "deepspeed_ckpt")
CASES = [(stage, dtype) for stage in range(4) for dtype in ("fp32", "bf16")]


def folder(stage, dtype):
    return os.path.join(DATA, f"stage{stage}_{dtype}")


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.LayerNorm(10), torch.nn.Linear(10, 3))


def expected(stage, dtype):
    return torch.load(os.path.join(folder(stage, dtype), "expected.pt"))


@pytest.mark.parametrize("stage,dtype", CASES)
def test_consolidate_reads_deepspeed_checkpoints_at_every_stage(stage, dtype):
    got, want = consolidate(folder(stage, dtype)), expected(stage, dtype)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_optimizer_state_is_reassembled_from_the_partitions(stage):
    """The same training at stage 0 and at ZeRO `stage`: exp_avg / exp_avg_sq agree (fp32 reduction order)."""
    ref, got = DeepSpeedCheckpoint(os.path.join(folder(0, "fp32"), "global_step2")), \
        DeepSpeedCheckpoint(os.path.join(folder(stage, "fp32"), "global_step2"))
    assert (got.stage, got.world_size) == (stage, 2)
    for name, p in ref.params.items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got.tensor(name, key), ref.tensor(name, key), rtol=1e-5, atol=1e-7)
        assert got.params[name]["scalars"]["step"]["value"] == 2.0


@pytest.mark.parametrize("stage,dtype", CASES)
def test_load_checkpoint_resumes_a_deepspeed_run(stage, dtype):
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine, _, _, _ = dsfast.initialize(model=model(), config=cfg, dist_init_required=False)
    path, client = engine.load_checkpoint(folder(stage, dtype))
    assert path.endswith("global_step2") and client == {"step": 2, "note": "ds"}
    assert engine.global_steps == 2 and engine.get_lr() == [0.01]
    want = expected(stage, dtype)
    names = {id(p): n for n, p in engine.module.named_parameters()}
    for p in engine.module.parameters():
        assert torch.equal(safe_get_full_fp32_param(p), want[names[id(p)]])
        # DeepSpeed 0.19.8's stage-0 bf16 optimizer stores step 3 after 2 steps; dsfast loads what is stored
        assert float(safe_get_full_optimizer_state(p, "step")) == (3.0 if (stage, dtype) == (0, "bf16") else 2.0)
        assert safe_get_full_optimizer_state(p, "exp_avg").shape == p.shape
    engine.backward(torch.nn.functional.mse_loss(engine(torch.ones(2, 6)).float(), torch.zeros(2, 3)))
    engine.step()                                            # and training goes on
    assert engine.global_steps == 3


@pytest.mark.parametrize("stage,dtype", [(2, "bf16"), (3, "fp32")])
def test_convert_deepspeed_writes_a_dsfast_checkpoint(tmp_path, stage, dtype):
    from dsfast.launcher.cli import main
    assert main(["convert-deepspeed", folder(stage, dtype), str(tmp_path)]) in (0, None)
    assert (tmp_path / "latest").read_text() == "global_step2"
    got, want = consolidate(str(tmp_path)), expected(stage, dtype)
    assert all(torch.equal(got[k], want[k]) for k in want)
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    engine, _, _, _ = dsfast.initialize(model=model(), config=cfg, dist_init_required=False)
    _, client = engine.load_checkpoint(str(tmp_path))
    assert client == {"step": 2, "note": "ds"} and engine.global_steps == 2


class Boom:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_pickle_naming_other_code_is_refused_not_run(tmp_path):
    src = os.path.join(folder(0, "fp32"), "global_step2", "mp_rank_00_model_states.pt")
    bad = tmp_path / "global_step2"
    bad.mkdir()
    sd = {"module": {}, "evil": Boom()}
    torch.save(sd, bad / "mp_rank_00_model_states.pt", pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(CheckpointCorruptError, match=r"mp_rank_00_model_states\.pt.*without running its code"):
        DeepSpeedCheckpoint(str(bad))
    assert os.path.exists(src)


def test_a_deepspeed_checkpoint_loads_into_an_nvme_offload_run(tmp_path):
    """Optimizer states on NVMe are swapped out between steps: the load visits each unit (read, filled, written
    back) instead of writing into released storage. DeepSpeed's moments exactly, and training goes on."""
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)}}}
    engine, _, _, _ = dsfast.initialize(model=model(), config=cfg, dist_init_required=False)
    engine.load_checkpoint(folder(2, "fp32"))
    ds = DeepSpeedCheckpoint(os.path.join(folder(2, "fp32"), "global_step2"))
    for name, p in engine.module.named_parameters():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(safe_get_full_optimizer_state(p, key).reshape(-1), ds.tensor(name, key).reshape(-1))
    engine.backward(torch.nn.functional.mse_loss(engine(torch.ones(2, 6)).float(), torch.zeros(2, 3)))
    engine.step()
    assert engine.global_steps == 3
