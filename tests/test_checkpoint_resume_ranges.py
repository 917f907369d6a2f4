"""Resuming at another world size or stage reads only each rank's ranges: the files and slices overlapping the
rank's records, each slice's input pages dropped once copied (dsfast checkpoints at ZeRO 1/2, and DeepSpeed
checkpoints, whose rank files are memory-mapped and never joined whole)."""
import os

import torch

from dsfast.checkpoint import load, pages, shards
from dsfast.checkpoint.deepspeed_import import DeepSpeedCheckpoint, _as_manifest, _MemFile
from dsfast.checkpoint.safetensors_io import SafeTensorsFile
from test_checkpoint import FakeOptimizer, _write_simulated, zero_like_layouts

DS_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "deepspeed_ckpt")


class Counting:
    """A file of shards.apply's open_file that records what is read and released."""

    def __init__(self, f, log):
        self.f, self.log = f, log

    def get(self, name):
        self.log.append(("get", name))
        return self.f.get(name)

    def release(self):
        self.log.append(("release", None))
        self.f.release()


def _overlapping(params, layout):
    want = set()
    for r in layout.records:
        for s in params[r.name]["slices"]:
            if s["start"] < r.stop and r.start < s["stop"]:
                want.add((r.name, s["start"]))
    return want


def test_a_dsfast_rank_reads_only_the_slices_overlapping_its_ranges(tmp_path):
    names, shapes = ["a.weight", "a.bias", "b.weight", "c"], [(5, 3), (5,), (4, 5), (7,)]
    g = torch.Generator().manual_seed(0)
    full = {k: {n: torch.randn(s, generator=g) for n, s in zip(names, shapes)} for k in ("master", "exp_avg")}
    m = _write_simulated(tmp_path, zero_like_layouts(shapes, 4, names), full)        # saved by 4 ranks
    for layout in zero_like_layouts(shapes, 2, names):                                # resumed by 2
        log, opened = [], []

        def open_file(name):
            opened.append(name)
            return Counting(SafeTensorsFile(str(tmp_path / name), m["files"][name]), log)
        shards.apply(layout, FakeOptimizer(), m["params"], open_file)
        read = {tuple(k.split("/")[0].split("@")) for op, k in log if op == "get"}
        want = {(n, str(s)) for n, s in _overlapping(m["params"], layout)}
        assert read == want and len(read) < sum(len(p["slices"]) for p in m["params"].values())
        assert set(opened) == set(load._files_needed(layout, m["params"])) and len(set(opened)) == 2
        gets_then_release = [op for op, _ in log]
        assert gets_then_release.count("release") == gets_then_release.count("get")   # each copy's pages dropped
        assert all(a == "get" and b == "release" for a, b in zip(gets_then_release[::2], gets_then_release[1::2]))


def test_a_deepspeed_rank_reads_only_the_fragments_overlapping_its_ranges():
    ds = DeepSpeedCheckpoint(os.path.join(DS_DATA, "stage2_fp32", "global_step2"))
    for p in ds.params.values():       # the fragments are views of the mapped rank files, not copies
        for _, _, piece in p["pieces"]:
            assert all(pages._file_mapping(t.data_ptr()) is not None for t in piece.values() if t.numel())
    params, tensors = _as_manifest(ds)
    names = list(params)
    shapes = [tuple(params[n]["shape"]) for n in names]
    for layout in zero_like_layouts(shapes, 3, names):            # saved by 2 ranks, resumed by 3
        mem, got = _MemFile(ds.path, tensors), []
        mem_get = mem.get
        mem.get = lambda key: (got.append(key), mem_get(key))[1]
        opt = FakeOptimizer()
        shards.apply(layout, opt, params, lambda _: mem)
        read = {tuple(k.split("/")[0].split("@")) for k in got}
        assert read == {(n, str(s)) for n, s in _overlapping(params, layout)}
        assert len(read) < sum(len(p["slices"]) for p in params.values())
        for r in layout.records:                                  # and the values are the joined ones
            n = r.stop - r.start
            want = ds.tensor(r.name)[r.start:r.stop]
            assert torch.equal(r.opt_param.detach().view(-1)[r.opt_offset:r.opt_offset + n], want)
            want = ds.tensor(r.name, "exp_avg")[r.start:r.stop]
            assert torch.equal(opt.state[r.opt_param]["exp_avg"].view(-1)[r.opt_offset:r.opt_offset + n], want)


def test_dropping_pages_never_touches_anonymous_memory():
    t = torch.arange(1 << 20, dtype=torch.float32)          # heap memory: MADV_DONTNEED would zero it
    pages.drop(t.data_ptr(), t.numel() * 4)
    assert torch.equal(t, torch.arange(1 << 20, dtype=torch.float32))


def test_a_zero3_engine_resumes_a_deepspeed_checkpoint_from_its_own_ranges(monkeypatch, tmp_path):
    import dsfast
    from test_checkpoint_deepspeed import expected, folder, model
    ds_read = []
    real = DeepSpeedCheckpoint.read_range
    monkeypatch.setattr(DeepSpeedCheckpoint, "read_range",
                        lambda self, name, a, b: (ds_read.append((name, a, b)), real(self, name, a, b))[1])
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 3, "param_persistence_threshold": 0},
           "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    engine, _, _, _ = dsfast.initialize(model=model(), config=cfg, dist_init_required=False)
    engine.load_checkpoint(folder(2, "bf16"))
    want = expected(2, "bf16")
    assert {n for n, _, _ in ds_read} == set(want) - {k for k in want if "running" in k}
    assert engine.global_steps == 2
    engine.save_checkpoint(str(tmp_path), "again")      # its fp32 masters are DeepSpeed's, exactly
    from dsfast.checkpoint import consolidate
    got = consolidate(str(tmp_path))
    assert all(torch.equal(got[k], want[k]) for k in want)
    with torch.no_grad():     # the module's (bf16) weights follow: the forward of the loaded model
        out = engine(torch.ones(2, 6))
    ref = model()
    ref.load_state_dict(want)
    torch.testing.assert_close(out.float(), ref.to(torch.bfloat16)(torch.ones(2, 6).to(torch.bfloat16)).float(),
                               rtol=2e-2, atol=2e-2)


def _status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def test_a_resharding_load_holds_one_slice_of_input_at_a_time(tmp_path):
    """2 ranks' ZeRO-2 files (96 MB: master + 2 states of 4 x 8 MB) loaded by one rank whose state is allocated
    already: the peak resident growth is the input being copied (one 8 MB slice, or the checksum's 8 MB chunk),
    not the files (before, each file's pages stayed resident once read)."""
    if not os.path.exists("/proc/self/clear_refs"):
        import pytest
        pytest.skip("needs Linux's /proc (peak RSS reset)")
    names, shapes = [f"w{i}" for i in range(4)], [(1 << 21,)] * 4
    full = {k: {n: torch.full(s, float(i)) for i, (n, s) in enumerate(zip(names, shapes))}
            for k in ("master", "exp_avg", "exp_avg_sq")}
    m = _write_simulated(tmp_path, zero_like_layouts(shapes, 2, names), full)
    del full
    layout = zero_like_layouts(shapes, 1, names)[0]
    opt = FakeOptimizer()
    for r in layout.records:              # the rank's own state, allocated before the load as an engine's is
        opt.state[r.opt_param] = {k: torch.zeros_like(r.opt_param) for k in ("exp_avg", "exp_avg_sq")}
        opt.state[r.opt_param]["exp_avg"].fill_(1)
        opt.state[r.opt_param]["exp_avg_sq"].fill_(1)
    layout.records[0].opt_param.data.fill_(1)
    files = {}

    def open_file(name):
        files.setdefault(name, SafeTensorsFile(str(tmp_path / name), m["files"][name]))
        return files[name]
    before = _status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    shards.apply(layout, opt, m["params"], open_file)
    growth = _status_bytes("VmHWM") - before
    assert sum(os.path.getsize(tmp_path / n) for n in files) > 90 << 20
    assert growth <= (8 << 20) + (4 << 20), growth           # one 8 MB slice or checksum chunk, plus slack
    r = layout.records[3]
    assert torch.equal(opt.state[r.opt_param]["exp_avg_sq"].view(-1)[r.opt_offset:r.opt_offset + 10],
                       torch.full((10,), 3.0))
