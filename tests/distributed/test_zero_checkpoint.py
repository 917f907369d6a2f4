"""Checkpoints at ZeRO stages on real gloo ranks: exact resume at the same stage and world size, and resume at
another world size or stage (the manifest reshapes the partitions, optimizer states included)."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402

WORKER = os.path.join(HERE, "worker_zero_ckpt.py")
N, STEPS = 4, 8


def run(stage, precision="fp32", offload=False, gas=1):
    return f"r:{stage}:{precision}:{int(offload)}:{gas}:0.05:{STEPS}:plain:config:-1"


def _save(tmp_path, run_text, world):
    ckpt, out = tmp_path / f"ckpt-{world}", tmp_path / f"straight-{world}.pt"
    launch(WORKER, ["save", run_text, N, ckpt, out], nprocs=world, timeout=200)
    return ckpt, torch.load(out)


def _resume(tmp_path, run_text, world, ckpt):
    out = tmp_path / f"resumed-{world}.pt"
    launch(WORKER, ["resume", run_text, ckpt, out], nprocs=world, timeout=200)
    return torch.load(out)


@pytest.mark.parametrize("stage,precision,offload", [(1, "fp32", True), (2, "fp32", False), (2, "bf16", False),
                                                    (3, "fp32", False), (3, "bf16", True)])
def test_exact_resume_at_the_same_stage_and_world_size(tmp_path, stage, precision, offload):
    ckpt, straight = _save(tmp_path, run(stage, precision, offload), 2)
    resumed = _resume(tmp_path, run(stage, precision, offload), 2, ckpt)
    assert resumed["global_steps"] == straight["global_steps"] == STEPS
    for name, value in straight["params"].items():
        assert torch.equal(resumed["params"][name], value), name   # bit for bit


@pytest.fixture(scope="module")
def saved_stage2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("zero-ckpt")
    return tmp, *_save(tmp, run(2, gas=2), 2)


@pytest.mark.parametrize("stage,world,gas", [(0, 1, 4), (1, 4, 1), (0, 2, 2), (3, 2, 2), (3, 4, 1)])
def test_a_stage2_checkpoint_from_2_ranks_resumes_at_another_stage_and_world_size(saved_stage2, stage, world, gas):
    tmp, ckpt, straight = saved_stage2
    resumed = _resume(tmp, run(stage, gas=gas), world, ckpt)
    # the same global batches (16 samples a step); only the reduction order differs from the uninterrupted run
    for name, value in straight["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, atol=1e-5, rtol=1e-5, msg=name)


def test_a_four_rank_stage1_checkpoint_resumes_on_two_ranks_at_stage2(tmp_path):
    ckpt, straight = _save(tmp_path, run(1), 4)
    resumed = _resume(tmp_path, run(2, gas=2), 2, ckpt)
    for name, value in straight["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, atol=1e-5, rtol=1e-5, msg=name)


def test_a_stage3_checkpoint_resumes_at_stage0_on_one_rank(tmp_path):
    ckpt, straight = _save(tmp_path, run(3, gas=2), 2)
    resumed = _resume(tmp_path, run(0, gas=4), 1, ckpt)
    for name, value in straight["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, atol=1e-5, rtol=1e-5, msg=name)


def test_a_stage3_checkpoint_holds_each_ranks_slice_and_resumes_on_four_ranks(tmp_path):
    # no rank gathers the model to save it: every rank wrote its own slice of every weight (module_slices.py)
    from dsfast.checkpoint.load import CheckpointReader, resolve
    ckpt, straight = _save(tmp_path, run(3, gas=2), 2)
    reader = CheckpointReader(resolve(ckpt, None)[0])
    sliced = reader.manifest["module_params"]
    assert sorted(sliced) == sorted(straight["params"])
    for name, entry in sliced.items():   # a rank whose slice is all padding (a small bias) writes nothing of it
        files = [s["file"] for s in entry["slices"]]
        numel = straight["params"][name].numel()
        assert files == [f"model_rank{r:05d}.safetensors" for r in range(len(files))], name
        assert len(files) == (2 if numel > sliced[name]["slices"][0]["stop"] else 1), name
    assert not set(reader.file(reader.manifest["module_file"]).keys()) & set(sliced)
    from dsfast.checkpoint.consolidate import consolidate
    whole, masters = reader.module_state(), consolidate(ckpt)
    for name in straight["params"]:   # fp32: the weights saved are the masters saved
        assert torch.equal(whole[name], masters[name]), name
    resumed = _resume(tmp_path, run(3), 4, ckpt)
    for name, value in straight["params"].items():
        torch.testing.assert_close(resumed["params"][name], value, atol=1e-5, rtol=1e-5, msg=name)


def _distance(a, b):
    x, y = torch.cat([a[n].flatten() for n in sorted(b)]), torch.cat([b[n].flatten() for n in sorted(b)])
    return float((x - y).norm() / y.norm())


def test_16bit_masters_and_states_resume_at_another_world_size_and_convert_to_fp32_masters_and_back(tmp_path):
    """bf16_master_weights_and_grads + bf16_optimizer_states saved at stage 3 on 2 ranks: exact resume at stage 2 on
    4 ranks would need the same reduction order, so the resumed runs are held to bf16 noise (1e-2; measured 7e-4 and
    3e-3) of the uninterrupted one; into an fp32-master run the bf16 masters and moments are widened (the
    states become fp32), and an fp32-master checkpoint loads into a bf16-master run rounded (bf16 states)."""
    ckpt, straight = _save(tmp_path / "low", run(3, "bf16m", gas=2), 2)
    assert straight["state_dtypes"] == {"torch.bfloat16"} and straight["master_dtypes"] == {"torch.bfloat16"}
    same = _resume(tmp_path / "low", run(3, "bf16m", gas=2), 2, ckpt)
    for name, value in straight["params"].items():
        assert torch.equal(same["params"][name], value), name    # same stage and world: bit for bit
    wider = _resume(tmp_path / "low", run(2, "bf16m", True, gas=1), 4, ckpt)
    assert wider["state_dtypes"] == {"torch.bfloat16"}
    assert _distance(wider["params"], straight["params"]) < 1e-2
    fp32 = _resume(tmp_path / "low", run(1, "bf16", gas=2), 2, ckpt)        # into fp32 masters and moments
    assert fp32["state_dtypes"] == {"torch.float32"} and fp32["master_dtypes"] == {"torch.float32"}
    assert _distance(fp32["params"], straight["params"]) < 1e-2
    back_ckpt, back_straight = _save(tmp_path / "back", run(2, "bf16", gas=2), 2)
    back = _resume(tmp_path / "back", run(3, "bf16m", True, gas=2), 2, back_ckpt)
    assert back["state_dtypes"] == {"torch.bfloat16"} and back["master_dtypes"] == {"torch.bfloat16"}
    assert _distance(back["params"], back_straight["params"]) < 1e-2
