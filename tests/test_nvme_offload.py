"""offload_optimizer on NVMe at ZeRO stages 1-3, one process (zero/nvme/states.py through the engine): training
is bitwise the CPU offload's, every unit's master and states really sit in their file between steps, checkpoints
save and load (and cross to CPU offload), the bytes show in memory_breakdown and the progress line, and faults
are clear errors that keep the previous step's files. (Two gloo ranks: tests/distributed/test_zero_nvme.py.)"""
import errno
import os
import re
import shutil
import warnings

import pytest
import torch

import dsfast
from dsfast.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
from dsfast.zero.nvme import io as nvme_io
from dsfast.zero.nvme.files import SWAP_ROOT
from dsfast.zero.nvme.buffers import aligned_size
from dsfast.zero.nvme.io import SwapError
from dsfast.zero.policy.placement import TEST_PLACEMENT_ENV
from _nvme_helpers import mounted_tmpfs, refuse_o_direct


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def _cfg(stage, offload, precision="fp32", gas=1, buffer_count=3, every=1000):
    zero = {"stage": stage, "reduce_bucket_size": 300}   # 3 units (buckets): each really swaps
    zero["offload_optimizer"] = {"device": "cpu"} if offload == "cpu" else \
        {"device": "nvme", "nvme_path": offload, "buffer_count": buffer_count}
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": every,
           "gradient_clipping": 0.1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "zero_optimization": zero}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return cfg


def _engine(cfg):
    model = _model()
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def _train(engine, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for _ in range(engine.gradient_accumulation_steps()):
            x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
            engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
            engine.step()
    return engine


def _same(a, b):
    for p, q in zip(a.module.parameters(), b.module.parameters()):
        assert torch.equal(p, q)


def _swap_dir(engine):
    return engine.state_owner.swap.dir.path


@pytest.mark.parametrize("overlap", [False, True])
def test_small_units_stay_in_host_memory_and_train_bitwise_as_cpu_offload(tmp_path, overlap):
    """Stage 3 (a unit per parameter): each bias's unit (one page of file) is small beside its weight's (48 pages),
    so its master and states stay in host memory: no file, no read, no write; the rest swap as before."""
    def engine(offload):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Tanh(), torch.nn.Linear(128, 128))
        off = {"device": "cpu"} if offload == "cpu" else {"device": "nvme", "nvme_path": offload, "buffer_count": 2}
        cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.1,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
               "zero_optimization": {"stage": 3, "offload_optimizer": {**off, "overlap_step": overlap},
                                     "stage3_param_persistence_threshold": 0}}
        return dsfast.initialize(model=m, model_parameters=m.parameters(), config=cfg, dist_init_required=False)[0]

    def train(e, reads=None):
        g = torch.Generator().manual_seed(3)
        for _ in range(3):
            x, y = torch.randn(4, 128, generator=g), torch.randn(4, 128, generator=g)
            e.backward(torch.nn.functional.mse_loss(e(x), y))
            e.step()
        e.state_owner.settle()
        if reads is not None:
            reads.append(e.state_owner.swap.io.bytes_read)
        return [safe_get_full_fp32_param(p).clone() for p in e.module.parameters()] + \
            [safe_get_full_optimizer_state(p, "exp_avg_sq").clone() for p in e.module.parameters()]

    ref = engine("cpu")
    want = train(ref)
    ref.destroy()
    got = engine(str(tmp_path))
    swap = got.state_owner.swap
    units = got.state_owner.store.units
    kept = [u for u in units if u.shard.numel() == 128]
    assert len(kept) == 2 and all(u.states_swap is None for u in kept)
    assert sorted(u.shard.numel() for u in swap.units) == [128 * 128] * 2   # only the weights have files
    reads = [swap.io.bytes_read]
    values = train(got, reads)
    assert all(torch.equal(a, b) for a, b in zip(values, want))
    # the two weights' files, read at most once a step (the first: masters only, no states yet); no bias's
    assert reads[1] - reads[0] <= 2 * aligned_size(128 * 128 * 4) + 2 * 2 * aligned_size(128 * 128 * 12)
    assert sorted(f for f in os.listdir(_swap_dir(got)) if f.startswith("unit")) == \
        sorted(f"unit{u.index}.swap" for u in swap.units)
    assert all(u.shard.untyped_storage().nbytes() > 0 for u in kept)   # (their masters never parked)
    got.destroy()


@pytest.mark.parametrize("placement", ["", "distinct-host"])   # the second runs every offload copy (placement.py)
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_nvme_trains_bitwise_as_cpu_offload(tmp_path, monkeypatch, precision, stage, placement):
    monkeypatch.setenv(TEST_PLACEMENT_ENV, placement)
    gas = 2 if precision == "fp32" else 1
    ref = _train(_engine(_cfg(stage, "cpu", precision, gas)), 5)
    got = _train(_engine(_cfg(stage, str(tmp_path), precision, gas)), 5)
    assert type(got.optimizer) is type(ref.optimizer)
    _same(got, ref)
    swap = got.state_owner.swap
    assert len(swap.units) == (4 if stage == 3 else 3)   # buckets; at stage 3 one unit per parameter
    assert swap.window.peak_in_use <= swap.window.buffer_count == 3
    # between steps every master and state is in its file only: no bytes in memory
    for u in swap.units:
        state = got.optimizer.state[u.shard]
        assert sorted(state) == ["exp_avg", "exp_avg_sq", "step"]
        for t in (u.shard, u.master, state["exp_avg"], state["exp_avg_sq"]):
            assert t.untyped_storage().nbytes() == 0 and t.numel() == u.plan.shard
        raw = torch.frombuffer(bytearray(open(swap.window.path(u.index), "rb").read()), dtype=torch.float32)
        # the reference's master of that unit: its optimizer steps one shard per unit, in unit order (one group)
        ref_master = [s for g in ref.optimizer.param_groups for s in g["params"]][u.index]
        assert torch.equal(raw[:u.plan.shard], ref_master)   # the master, first in the file
    for p, q in zip(got.module.parameters(), ref.module.parameters()):   # read back through the API
        assert torch.equal(safe_get_full_fp32_param(p), safe_get_full_fp32_param(q))
        assert torch.equal(safe_get_full_optimizer_state(p, "exp_avg_sq"), safe_get_full_optimizer_state(q,
                                                                                                      "exp_avg_sq"))
    assert swap.units[0].shard.untyped_storage().nbytes() == 0   # and back to disk
    where = _swap_dir(got)
    got.destroy()
    assert not os.path.exists(where) and os.listdir(tmp_path / SWAP_ROOT) == []


def test_checkpoints_save_and_load_with_states_on_nvme_and_cross_to_cpu(tmp_path):
    nvme = str(tmp_path / "nvme")
    os.mkdir(nvme)
    ref = _train(_engine(_cfg(2, "cpu", "bf16")), 6)
    first = _train(_engine(_cfg(2, nvme, "bf16")), 3)
    swap = first.state_owner.swap
    unit_bytes = sum(aligned_size(n) for n in swap.window.sizes.values())
    read, written = swap.io.bytes_read, swap.io.bytes_written
    first.save_checkpoint(str(tmp_path / "ck"), tag="t3")
    # streamed: every unit read at most once (the next step's first is in the window already), one at a time
    # (within the window), nothing written
    assert 0 < swap.io.bytes_read - read <= unit_bytes and swap.io.bytes_written == written
    assert swap.window.peak_in_use <= swap.window.buffer_count
    assert swap.units[1].shard.untyped_storage().nbytes() == 0   # parked again after save
    first.save_checkpoint(str(tmp_path / "ck"), tag="t3async", async_save=True)   # copied unit by unit
    _train(first, 3, seed=5)   # moves on: the checkpoints must not follow
    for resume, tag in ((_cfg(2, nvme, "bf16"), "t3"), (_cfg(2, "cpu", "bf16"), "t3"), (_cfg(2, nvme, "bf16"),
                                                                                        "t3async")):
        e = _engine(resume)
        if e.state_owner.swap is not None:
            read, written = e.state_owner.swap.io.bytes_read, e.state_owner.swap.io.bytes_written
        e.load_checkpoint(str(tmp_path / "ck"), tag=tag)
        if e.state_owner.swap is not None:   # each unit read, filled and written once (states appear: a new
            io = e.state_owner.swap.io       # layout), and read once more to write the 16-bit values back
            assert io.bytes_written - written == unit_bytes and io.bytes_read - read < 3 * unit_bytes
        g = torch.Generator().manual_seed(1)   # the data of steps 4-6 of ref
        for _ in range(3):
            torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
        _train_from(e, g, 3)
        _same(e, ref)


def _train_from(engine, g, steps):
    for _ in range(steps):
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()


def test_memory_breakdown_and_progress_line_show_the_nvme_bytes(tmp_path, capsys):
    e = _train(_engine(_cfg(1, str(tmp_path), every=2)), 4)
    files = [os.path.join(_swap_dir(e), f) for f in os.listdir(_swap_dir(e))]
    on_disk = sum(os.path.getsize(f) for f in files)
    mb = e.memory_breakdown()
    assert mb["total"]["nvme"] == mb["nvme_files"]["nvme"] == on_disk > 0
    assert mb["swap_window"]["host"] == sum(b.numel() for b in e.state_owner.swap.host_buffers())
    assert "optimizer_states" not in mb or not mb["optimizer_states"]   # none held in memory
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[dsfast] step 4")]
    per_step = on_disk / 2**20   # every file read and written once per step
    assert lines and f"nvme read {per_step:.1f} MiB written {per_step:.1f} MiB per step" in lines[0]
    assert e.swap_bytes() == (e.state_owner.swap.io.bytes_read, e.state_owner.swap.io.bytes_written)


def test_a_missing_nvme_path_is_refused_at_initialize(tmp_path):
    with pytest.raises(ValueError, match=r"offload_optimizer.nvme_path='.*nowhere' does not exist"):
        _engine(_cfg(2, str(tmp_path / "nowhere")))


def test_a_failed_write_mid_run_names_file_and_step_and_keeps_the_previous_files(tmp_path, monkeypatch):
    e = _train(_engine(_cfg(2, str(tmp_path))), 2)
    where = _swap_dir(e)
    before = {f: open(os.path.join(where, f), "rb").read() for f in os.listdir(where)}
    real = os.pwritev
    calls = []

    def fails_second(fd, buffers, offset):   # the second unit's write of step 3 finds the disk full
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)
    monkeypatch.setattr(nvme_io.os, "pwritev", fails_second)
    with pytest.raises(SwapError, match=r"write of '.*unit\d+\.swap' at step 3 failed: No space left on device.*"
                                        "previous step is intact") as failed:
        _train(e, 1, seed=9)   # (which unit's write comes second: the I/O pool's two threads decide)
    monkeypatch.undo()
    name = re.search(r"(unit\d+\.swap)", str(failed.value)).group(1)
    assert open(os.path.join(where, name), "rb").read() == before[name]
    assert not [f for f in os.listdir(where) if not f.endswith(".swap")]   # the partial bytes: in a spare
    shutil.rmtree(where, ignore_errors=True)


def test_too_little_host_memory_for_the_window_is_refused_before_allocating(tmp_path, monkeypatch):
    from dsfast.zero.nvme import checks as nvme_checks
    monkeypatch.setattr(nvme_checks, "meminfo_available", lambda: 1000)
    with pytest.raises(ValueError, match=r"the host swap buffers need 24576 bytes .* only 1000 bytes .* lower "
                                         r"offload_optimizer.buffer_count or zero_optimization.reduce_bucket_size"):
        _engine(_cfg(2, str(tmp_path)))   # 3 buffers of the largest unit's file (the 33x16 weight's bucket:
        # 528 elements x 12 bytes -> 2 pages)
    assert os.listdir(tmp_path) == []   # nothing written


def test_the_estimate_adds_the_nvme_rows_and_column():
    import subprocess
    import sys
    from dsfast.zero import estimate_model_states
    from dsfast.zero.nvme.states import window_bytes
    rows = estimate_model_states(1e9, 4, nvme=True, buffer_count=3, bucket=1e8, largest_layer=4e7)
    by = {(r["stage"], r["offload_optimizer"], r["offload_param"]): r for r in rows}
    assert len(rows) == 15 and "nvme" not in by[(2, True, False)]
    # offload_param on NVMe too: the 16-bit shards leave the host for files; the host keeps 5 shard buffers
    both, states_only = by[(3, "nvme", "nvme")], by[(3, "nvme", True)]
    assert both["nvme"] == states_only["nvme"] + 2 * 1e9 / 4
    assert both["host"] == states_only["host"] - 2 * 1e9 / 4 + 5 * aligned_size(2 * (int(4e7) // 4 + 1))
    for stage, unit in ((1, 1e8), (2, 1e8), (3, 4e7)):
        cpu, nvme = by[(stage, True, False)], by[(stage, "nvme", False)]
        assert nvme["nvme"] == 12 * 1e9 / 4 and nvme["device"] == cpu["device"]
        assert nvme["host"] == cpu["host"] - 12 * 1e9 / 4 + window_bytes(int(unit) // 4 + 1, 3)
    assert len(estimate_model_states(1e9, 4)) == 9   # without nvme=True: the rows as before
    run = subprocess.run([sys.executable, "-m", "dsfast.zero.planning.estimate", "--params", "1e9", "--world-size", "4",
                          "--nvme", "--bucket", "1e8", "--buffer-count", "3"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    line = [ln.split() for ln in run.stdout.splitlines() if ln.split()[:3] == ["2", "nvme", "False"]][0]
    assert float(line[5]) == pytest.approx(12 * 1e9 / 4 / 2**30, abs=0.01) and "nvme GiB" in run.stdout


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("client", [False, True], ids=["cpu_adam", "torch_adamw"])
def test_param_groups_and_a_torch_optimizer_step_bitwise_as_cpu_offload(tmp_path, stage, client):
    """Two groups (lr and weight decay apart) and either the config's AdamW (CPUAdam) or a torch.optim.AdamW
    instance (the generic contract): each unit is stepped in its own group, with that group's hyperparameters."""
    def run(offload):
        model = _model()
        decay = [p for p in model.parameters() if p.dim() > 1]
        rest = [p for p in model.parameters() if p.dim() == 1]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0, "lr": 3e-2}]
        cfg = _cfg(stage, offload, "bf16")
        opt = None
        if client:
            del cfg["optimizer"]
            cfg["zero_force_ds_cpu_optimizer"] = False     # a torch optimizer under offload, as DeepSpeed allows
            opt = torch.optim.AdamW(groups, lr=1e-2)
        e = dsfast.initialize(model=model, model_parameters=groups, optimizer=opt, config=cfg,
                              dist_init_required=False)[0]
        return _train(e, 4)
    ref, got = run("cpu"), run(str(tmp_path))
    _same(got, ref)
    assert [g["lr"] for g in got.optimizer.param_groups] == [1e-2, 3e-2]
    assert [len(g["params"]) for g in got.optimizer.param_groups] == \
        [len(g["params"]) for g in ref.optimizer.param_groups]   # the groups are whole again after the step


_RSS_CHILD = r"""
import sys, torch
import dsfast
where = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1536, 1536) for _ in range(12)])   # 28M parameters
off = {"device": "cpu"} if where == "cpu" else {"device": "nvme", "nvme_path": where, "buffer_count": 4}
cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 6, "bf16": {"enabled": True},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
       "zero_optimization": {"stage": 2, "offload_optimizer": off}}
e = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg, dist_init_required=False)[0]
x = torch.randn(2, 1536).bfloat16()
for _ in range(3):
    e.backward(e(x).float().pow(2).mean())
    e.step()
rss = int(dict(l.split(":", 1) for l in open("/proc/self/status"))["VmRSS"].split()[0]) * 1024
window = sum(b.numel() for b in e.state_owner.swap.host_buffers()) if e.state_owner.swap else 0
print(rss, window)
"""


def test_host_memory_holds_the_window_not_the_states(tmp_path):
    """Between steps a process with NVMe offload holds the window where CPU offload holds every master and moment
    (28M parameters: 12 bytes each, 340 MB): its resident memory is lower by the states less the window."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
               OMP_NUM_THREADS="1")
    out = {}
    for where in ("cpu", str(tmp_path)):
        run = subprocess.run([sys.executable, "-c", _RSS_CHILD, where], capture_output=True, text=True, env=env,
                             timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        out[where] = [int(v) for v in run.stdout.split()]
    (cpu_rss, _), (nvme_rss, window) = out["cpu"], out[str(tmp_path)]
    states = 12 * 12 * (1536 * 1536 + 1536)
    assert 0 < window <= 4 * 12 * (1536 * 1536 + 1536) + 4 * 4096   # 4 buffers of one layer's file
    assert nvme_rss < cpu_rss - 0.8 * (states - window), (cpu_rss, nvme_rss, states, window)


def test_the_monitor_records_the_bytes_read_and_written_per_step(tmp_path):
    import csv
    cfg = _cfg(2, str(tmp_path / "nvme"))
    os.mkdir(tmp_path / "nvme")
    cfg["csv_monitor"] = {"enabled": True, "output_path": str(tmp_path / "mon"), "job_name": "j"}
    e = _train(_engine(cfg), 3)
    per_step = sum(aligned_size(n) for n in e.state_owner.swap.window.sizes.values())
    for kind in ("read", "written"):
        with open(tmp_path / "mon" / "j" / f"Train_Samples_nvme_{kind}_bytes.csv", newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["step", f"nvme_{kind}_bytes"] and [int(r[0]) for r in rows[1:]] == [4, 8, 12]
        values = [float(r[1]) for r in rows[1:]]
        # every unit read and written once per step (a unit already in the window is not read again)
        assert values[-1] <= per_step and (kind == "read" or values == [per_step] * 3)


def test_two_engines_on_one_nvme_path_keep_apart_and_a_refused_o_direct_falls_back(tmp_path, monkeypatch,
                                                                                    caplog):
    """Two jobs' engines (here in one process) point at one nvme_path: each writes under its own directory and
    trains as CPU offload does. The filesystem refuses O_DIRECT (as tmpfs may): buffered I/O, with a warning."""
    import logging
    refuse_o_direct(monkeypatch)
    ref = _train(_engine(_cfg(2, "cpu", "bf16")), 3)
    with caplog.at_level(logging.WARNING, logger="dsfast.zero.nvme"):
        a, b = _engine(_cfg(2, str(tmp_path), "bf16")), _engine(_cfg(2, str(tmp_path), "bf16"))
        assert _swap_dir(a) != _swap_dir(b)
        ga, gb = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
        for _ in range(3):   # interleaved: each step of one between the steps of the other
            _train_from(a, ga, 1)
            _train_from(b, gb, 1)
    _same(a, ref)
    _same(b, ref)
    assert not a.state_owner.swap.io.direct and "O_DIRECT is refused" in caplog.text
    assert sorted(os.listdir(tmp_path / SWAP_ROOT)) == sorted(
        os.path.basename(d) + s for d in (_swap_dir(a), _swap_dir(b)) for s in ("", ".lock"))
    a.destroy()
    assert os.path.exists(_swap_dir(b)) and len(os.listdir(_swap_dir(b))) >= 3   # b's files untouched


def test_offload_states_and_back_with_states_on_nvme_trains_on_bitwise(tmp_path):
    """engine.offload_states() moves what the device holds; the NVMe window is host memory mapped for the swap (not
    resizable): it stays, and training after reload_states() is CPU offload's."""
    e, ref = _train(_engine(_cfg(2, str(tmp_path), "bf16")), 2), _train(_engine(_cfg(2, "cpu", "bf16")), 2)
    for engine in (e, ref):
        engine.offload_states()
        engine.reload_states()
        _train(engine, 2, seed=3)
    _same(e, ref)


def test_an_nvme_path_without_room_for_the_states_is_refused_at_initialize(tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=4k") as small:
        with pytest.raises(ValueError, match=rf"offload_optimizer.nvme_path='{small}' has 4096 bytes \(0.00 GiB\) "
                                             r"free but the swap files need \d+ bytes"):
            _engine(_cfg(2, str(small)))
        assert os.listdir(small) == []


def test_an_optimizer_that_may_read_across_parameters_is_refused_with_nvme(tmp_path):
    # the NVMe step runs the optimizer one unit at a time: exact only for element-wise optimizers (LBFGS reads every
    # parameter through its closure and keeps its own flat history)
    model = _model()
    cfg = _cfg(2, str(tmp_path))
    del cfg["optimizer"]
    cfg["zero_force_ds_cpu_optimizer"] = False
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r'"nvme" steps the optimizer one unit .*torch\.optim\.lbfgs\.LBFGS.*AdamW'):
        dsfast.initialize(model=model, model_parameters=model.parameters(), optimizer=opt, config=cfg,
                          dist_init_required=False)
    assert not [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".swap")]   # removed already
    cpu = _model()   # the same optimizer is fine where nothing is swapped
    dsfast.initialize(model=cpu, model_parameters=cpu.parameters(), optimizer=torch.optim.LBFGS(cpu.parameters()),
                      config={**_cfg(2, "cpu"), "zero_force_ds_cpu_optimizer": False}, dist_init_required=False)


def test_an_nvme_path_in_memory_warns_that_it_saves_nothing(tmp_path):
    # /dev/shm (tmpfs) is host memory: the "swapped" states would still be there; say so, and train as asked
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    import tempfile
    where = tempfile.mkdtemp(dir="/dev/shm", prefix="dsfast-test-nvme-")
    try:
        with pytest.warns(UserWarning, match=r"is on tmpfs, which lives in host memory.*saves nothing"):
            e = _engine(_cfg(2, where))
        _same(_train(e, 2), _train(_engine(_cfg(2, "cpu")), 2))
        e.destroy()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    from dsfast.zero.nvme.checks import MEMORY_FILESYSTEMS, filesystem_of
    if filesystem_of(tmp_path) not in MEMORY_FILESYSTEMS:
        with warnings.catch_warnings():   # a directory on a disk: no such warning
            warnings.simplefilter("error", UserWarning)
            _engine(_cfg(2, str(tmp_path))).destroy()


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_the_estimated_window_counts_only_the_units_a_model_has(tmp_path, precision):
    """The window's buffers are made as units come in: 2 units under buffer_count 4 hold 2 buffers, and the
    estimate (python -m dsfast.zero.estimate, dsfast plan) says so instead of 4."""
    from dsfast.zero.planning.estimate import estimate_model_states
    width = 256
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, width))
    psi = sum(p.numel() for p in model.parameters())
    bucket = width * width + width   # one layer a unit
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": bucket,
                                 "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path),
                                                       "buffer_count": 4, "state_precision": precision}}}
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    for _ in range(2):
        engine.backward(engine(torch.randn(2, width)).float().pow(2).mean())
        engine.step()
    window = engine.memory_breakdown()["swap_window"]["host"]
    assert len(engine.state_owner.swap.host_buffers()) == 2
    row = next(r for r in estimate_model_states(psi, 1, mixed=False, nvme=True, bucket=bucket,
                                                states8=precision == "int8")
               if (r["stage"], r["offload_optimizer"], r["offload_param"]) == (2, "nvme", False))
    assert row["host"] == window
