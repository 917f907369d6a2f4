"""zero_optimization.offload_optimizer.overlap_step (zero/step/overlap.py) on one rank: the host step runs in a
worker after engine.step() returns, and the result is bitwise the serial step's (torch.equal on every parameter,
fp32 master and Adam state, the same losses, lr, counters and loss scale) at stages 1-3, fp32/bf16, with clipping,
a scheduler, fp16 overflow skips, gradient accumulation and managed_gradient_accumulation false. Everything that
reads the model right after step() (a checkpoint, safe_get_*, an eval forward) sees the updated values; a failure
in the worker is raised at the next call naming the unit and the step; the key's bad values are refused.
Every run is under the test placement (host distinct from the "device") and the seeded chaos delays, so that a
missing wait reads stale values. The 2-rank runs (stages 1-2's gathers, stage 3) are
tests/distributed/test_overlap_step_dp.py."""
import json

import pytest
import torch

import dsfast
from safetensors.torch import load_file
from _overlap_helpers import assert_same, batch, config, engine, fail_second_group_step, model, snapshot, train
from dsfast.zero.step.overlap import OverlapFailure


@pytest.fixture(autouse=True)
def _placement_and_chaos(monkeypatch):
    monkeypatch.setenv("DSFAST_TEST_PLACEMENT", "distinct-host")
    monkeypatch.setenv("DSFAST_STREAM_CHAOS", "7")
    monkeypatch.setenv("DSFAST_STREAM_CHAOS_MS", "2")


def _both(stage, steps=4, gas=1, overflow_at=None, **kw):
    """(serial, overlapped): losses and snapshot of the same run."""
    out = []
    for overlap in (False, True):
        eng = engine(stage, overlap=overlap, gas=gas, **kw)
        losses = train(eng, steps, gas=gas, overflow_at=overflow_at)
        out.append((losses, snapshot(eng)))
    return out


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bitwise_the_serial_step_with_clipping_and_a_scheduler(stage, precision):
    (l0, s0), (l1, s1) = _both(stage, precision=precision, clip=0.05, scheduler=True)
    assert l0 == l1
    assert_same(s0, s1)


@pytest.mark.parametrize("stage", [1, 2])
def test_bitwise_without_the_test_placement(stage, monkeypatch):
    # host and "device" the same memory: the worker reads the gradients in place, and zeroing them waits for it
    monkeypatch.delenv("DSFAST_TEST_PLACEMENT")
    (l0, s0), (l1, s1) = _both(stage, clip=0.05)
    assert l0 == l1
    assert_same(s0, s1)


@pytest.mark.parametrize("stage", [1, 3])
def test_fp16_overflow_skip_and_gradient_accumulation(stage):
    (l0, s0), (l1, s1) = _both(stage, steps=4, gas=2, overflow_at=1, precision="fp16", clip=1.0)
    assert s1["steps"][2] == 1   # the inf loss was skipped, by both
    assert l0[2:] == l1[2:]      # (the skipped step's losses are inf: inf == inf, nan != nan)
    assert_same(s0, s1)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_unmanaged_gradient_accumulation(stage):
    (l0, s0), (l1, s1) = _both(stage, steps=3, gas=2, managed=False, scheduler=True)
    assert l0 == l1
    assert_same(s0, s1)


def test_the_forward_waits_per_module_in_first_use_order():
    eng = engine(2)
    train(eng, 2)
    overlap = eng.state_owner.overlap
    units = eng.state_owner.store.units   # stage 2's buckets hold the last layers first: the forward's order is
    assert overlap.order == [u.index for u in reversed(units)] != [u.index for u in units]   # theirs reversed
    assert [u.index for u in overlap.units_in_order()] == overlap.order
    overlap.order = None   # before the first forward: the model's parameter order
    assert [u.index for u in overlap.units_in_order()] == [u.index for u in reversed(units)]
    assert len(overlap._units_of) == 3   # the three Linear layers, not the Sequential or the ReLUs


# ---- whatever reads the model right after step() gets the updated values ------------------------------------
def _readers_after_step(stage, monkeypatch, tmp_path, overlap, nvme=False):
    """After step s the first reader is: s=0 an eval forward, s=1 a checkpoint save, s=2 safe_get_full_fp32_param
    (each the one that must wait); then the other two read too. nvme: the optimizer states on NVMe."""
    monkeypatch.setenv("DSFAST_STREAM_CHAOS_MS", "15")   # a worker far behind the main thread
    eng = engine(stage, overlap=overlap, precision="bf16", nvme=tmp_path / f"swap{int(overlap)}" if nvme else None)
    seen = []

    def evaluate(e):
        e.eval()
        with torch.no_grad():
            seen.append([e(batch(99, torch.bfloat16)[0])])
        e.train()

    def masters(e):
        seen.append([dsfast.utils.safe_get_full_fp32_param(p) for p in e.module.parameters()])

    def read(e, s):
        if s == 1:
            e.save_checkpoint(str(tmp_path / f"ckpt{int(overlap)}"), tag="t")
        (masters if s == 2 else evaluate)(e)
        (evaluate if s == 2 else masters)(e)
    train(eng, 3, after_step=read)
    return seen


@pytest.mark.parametrize("stage, nvme", [(1, False), (3, False), (2, True), (3, True)])
def test_eval_forward_checkpoint_and_safe_get_right_after_step(stage, nvme, monkeypatch, tmp_path):
    serial = _readers_after_step(stage, monkeypatch, tmp_path, False, nvme)
    overlapped = _readers_after_step(stage, monkeypatch, tmp_path, True, nvme)
    assert len(serial) == len(overlapped) == 6
    for a, b in zip(serial, overlapped):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    files = sorted(p.name for p in (tmp_path / "ckpt0" / "t").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "ckpt1" / "t").iterdir())
    assert "model.safetensors" in files and any(n.startswith("optim_") for n in files)
    for name in (n for n in files if n.endswith(".safetensors")):   # the weights and every optimizer state
        _same_tree(load_file(tmp_path / "ckpt0" / "t" / name), load_file(tmp_path / "ckpt1" / "t" / name), name)


def _same_tree(a, b, where):
    if torch.is_tensor(a):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same_tree(a[k], b[k], f"{where}.{k}")


@pytest.mark.parametrize("stage", [2, 3])
def test_destroy_waits_for_the_step_and_stops_the_worker(stage):
    serial, overlapped = engine(stage, overlap=False), engine(stage)
    for eng in (serial, overlapped):
        train(eng, 2)
    worker = overlapped.state_owner.store.lanes.host_lane("step")
    overlapped.destroy()   # right after step(): the module keeps the updated values
    serial.destroy()
    for a, b in zip(serial.module.parameters(), overlapped.module.parameters()):
        assert torch.equal(a, b)
    assert not worker._thread.is_alive()


# ---- a failure in the worker --------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [1, 3])
def test_a_worker_failure_is_raised_at_the_next_call_naming_unit_and_step(stage):
    eng = engine(stage)
    train(eng, 1)
    eng.state_owner.settle()   # (the first step's items are not patched below)
    fail_second_group_step(eng.optimizer)
    x, y = batch(5)
    eng.backward(torch.nn.functional.mse_loss(eng(x), y))
    eng.step()   # returns: the failure is in the worker
    loss = torch.nn.functional.mse_loss(eng(x), y)   # the forward runs (its waits raise nothing: on several
    with pytest.raises(OverlapFailure, match=r"optimizer step 2 failed on rank 0 at unit \d+ \(parameters "   # ranks
                                             r"\d\.(weight|bias).*OSError: disk on fire"):   # one could hang);
        eng.backward(loss)                                                         # the next backward raises
    with pytest.raises(OverlapFailure, match="step 2"):   # and at every later call that reads the model
        dsfast.utils.safe_get_full_fp32_param(next(eng.module.parameters()))


# ---- the key --------------------------------------------------------------------------------------------------
def _init(cfg, optimizer=None):
    m = model()
    return dsfast.initialize(model=m, model_parameters=m.parameters(), config=cfg, optimizer=optimizer,
                             dist_init_required=False)


@pytest.mark.parametrize("value", ["true", 1, None])
def test_a_non_bool_is_an_error_naming_the_key(value):
    cfg = config(2)
    cfg["zero_optimization"]["offload_optimizer"]["overlap_step"] = value
    with pytest.raises(Exception, match=r"zero_optimization\.offload_optimizer\.overlap_step.*true or false"):
        _init(cfg)


@pytest.mark.parametrize("stage, device, valid", [(0, "cpu", "ZeRO stage 1, 2 or 3 \\(stage is 0\\)"),
                                                  (2, "none", '"cpu" or "nvme" \\(it is "none"')])
def test_where_it_cannot_apply_is_an_error_naming_the_key(stage, device, valid, tmp_path):
    cfg = config(stage)
    cfg["zero_optimization"]["offload_optimizer"].update(device=device, nvme_path=str(tmp_path))
    with pytest.raises(Exception, match=r"zero_optimization\.offload_optimizer\.overlap_step.*" + valid):
        _init(cfg)


def test_an_optimizer_without_a_per_unit_entry_is_refused():
    cfg = {**config(2), "zero_force_ds_cpu_optimizer": False}
    del cfg["optimizer"]
    m = model()
    with pytest.raises(ValueError, match=r"overlap_step: true .* SGD is not one\. Valid: dsfast's optimizers "
                                         r"\(.*CPUAdam.*\)"):
        dsfast.initialize(model=m, model_parameters=m.parameters(), config=cfg,
                          optimizer=torch.optim.SGD(m.parameters(), lr=0.1), dist_init_required=False)


def test_explain_shows_it_as_dsfast_own_key(tmp_path, capsys):
    from dsfast.config.__main__ import main
    cfg = config(2)
    del cfg["zero_optimization"]["offload_optimizer"]["overlap_step"]   # (the default is shown with its origin)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    main([str(path), "--explain"])
    line = [x for x in capsys.readouterr().out.splitlines() if "overlap_step" in x]
    assert len(line) == 1 and "= False" in line[0] and "dsfast's own key" in line[0] and "half-updated" in line[0]


def test_a_data_parallel_group_short_of_every_rank_is_refused(monkeypatch):
    # (the workers' gather group is made by every rank of the default group alike: model or pipeline parallel
    # groups would need one per data-parallel group)
    from dsfast.zero.step import overlap as overlap_module
    monkeypatch.setattr(overlap_module.dist, "get_process_group_ranks", lambda group: [0, 2])
    monkeypatch.setattr(overlap_module.dist, "get_world_size", lambda group=None: 4)
    step = overlap_module.OverlappedStep(store=None, world=2, rank=0, group=object())
    with pytest.raises(ValueError, match=r"overlap_step: true needs the data-parallel group to be every rank"):
        step.make_gather_group()
