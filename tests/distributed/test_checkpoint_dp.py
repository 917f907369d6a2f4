"""Checkpoints on real gloo ranks: exact resume, resharded resume, the seeds' loop, kills mid-save, misuse."""
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402

WORKER = os.path.join(HERE, "worker_ckpt.py")
N, M = 3, 3


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def trained(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"ckpt_{request.param}")
    launch(WORKER, ["train", out, request.param, N, M], nprocs=2, timeout=120)
    return request.param, out


def test_exact_resume_in_a_fresh_process_group_bit_for_bit(trained):
    precision, out = trained
    launch(WORKER, ["resume", out, precision, M], nprocs=2, timeout=120)
    at_save, loaded = torch.load(out / "at_save.pt"), torch.load(out / "loaded_w2.pt")
    assert loaded["client"] == {"step": N, "rank0": True} and loaded["path"].endswith(f"t{N}")
    assert _equal(loaded["masters"], at_save["masters"])
    assert loaded["global_steps"] == N and loaded["loss_scale"] == at_save["loss_scale"]
    end, resumed = torch.load(out / "end.pt"), torch.load(out / "resumed_w2.pt")
    assert _equal(resumed["masters"], end["masters"])          # N + M == N, save, load, M: bit for bit
    assert _equal(list(resumed["module"].values()), list(end["module"].values()))
    for a, b in zip(resumed["states"], end["states"]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["lr"] == end["lr"] and resumed["lr_state"] == end["lr_state"]
    assert resumed["loss_scale"] == end["loss_scale"]
    if precision == "fp16":
        assert end["loss_scale"] != 2.0 ** 8 or True   # the scaler state itself is compared above


@pytest.mark.parametrize("world", [1, 4])
def test_a_two_rank_checkpoint_loads_on_other_world_sizes(trained, world):
    precision, out = trained
    if precision != "fp32":
        pytest.skip("one precision is enough for the world-size change")
    launch(WORKER, ["resume", out, precision, 1], nprocs=world, timeout=150)
    at_save, loaded = torch.load(out / "at_save.pt"), torch.load(out / f"loaded_w{world}.pt")
    assert _equal(loaded["masters"], at_save["masters"])
    for a, b in zip(loaded["states"], at_save["states"]):
        assert all(torch.equal(a[k], b[k]) for k in b)
    assert loaded["lr_state"] == at_save["lr_state"]


def test_the_seeds_loop_with_float_tags_and_client_sd(tmp_path):
    launch(WORKER, ["seeds", tmp_path], nprocs=2, timeout=120)
    got = torch.load(tmp_path / "seeds.pt")
    assert len(got["tags"]) == 2 and all(float(t) == float(t) for t in got["tags"])
    assert got["latest"] == got["tags"][-1]
    assert sorted(os.listdir(tmp_path / "ckpt")) == sorted(got["tags"] + ["latest"])


@pytest.mark.parametrize("point,tag", [("shard_tensor:0", "bad"), ("begin:1", "bad"), ("before_rename:0", "bad"),
                                       ("between_renames:0", "good"), ("before_latest:0", "bad")])
def test_a_save_killed_mid_way_leaves_the_previous_checkpoint_loadable(tmp_path, point, tag):
    """SIGKILL of one rank mid-file, after it agreed, before / between the renames (re-saving the same tag) and
    before `latest` moves: the other rank errors (no hang) and the previous checkpoint loads as it was."""
    results = launch(WORKER, ["kill", tmp_path, "fp32", point, tag], nprocs=2, timeout=120, check=False)
    killed = int(point.split(":")[1])
    assert results[killed][0] == -9, results[killed]              # a real SIGKILL
    survivor = results[1 - killed]
    assert survivor[0] == 3 and "SURVIVOR" in survivor[1], survivor
    ckpt = tmp_path / "ckpt"
    import dsfast
    from dp_common import build_model, ds_config
    good = torch.load(tmp_path / "good.pt")
    assert (ckpt / "latest").read_text() == "good"
    model = build_model()
    engine, _, _, _ = dsfast.initialize(model=model, config=ds_config("fp32", 1, 1, 0.0), dist_init_required=False)
    path, client = engine.load_checkpoint(str(ckpt))
    # a kill between the renames of a re-save leaves the old folder aside; the load reads it there
    assert os.path.basename(path) == "good" or os.path.basename(path).startswith(".old-good-")
    assert client == {"step": 2}
    assert _equal([dsfast.utils.safe_get_full_fp32_param(p) for p in engine.module.parameters()], good["masters"])


def test_differing_tags_and_rank0_only_save_fail_with_clear_errors_in_bound(tmp_path):
    bound = 3.0
    results = launch(WORKER, ["misuse", tmp_path, bound], nprocs=2, timeout=120)
    got = [json.loads(o.split("RESULT ", 1)[1].splitlines()[0]) for _, o in results]
    for r in got:
        assert "rank 0 'tag_of_rank0', rank 1 'tag_of_rank1'" in r["tags"] and r["assertion"]
        assert r["warned"]
    assert not (tmp_path / "ckpt" / "tag_of_rank0").exists()
    assert (tmp_path / "ckpt" / "warn_of_rank0").is_dir() and not (tmp_path / "ckpt" / "warn_of_rank1").exists()
    assert "rank(s) 1 did not reach" in got[0]["rank0_only"] and "if rank == 0" in got[0]["rank0_only"]
    assert bound <= got[0]["elapsed"] < bound + 5
    assert not (tmp_path / "ckpt" / "only_rank0").exists()
