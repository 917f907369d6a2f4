"""offload_param on NVMe at ZeRO stage 3, one process (zero/nvme/params.py through the engine): training is bitwise
offload_param "cpu"'s, alone and with offload_optimizer on NVMe; between steps every shard is in its file only;
the window stays within buffer_count and reads ahead in the last step's order; max_in_cpu keeps shards in memory;
checkpoints and GatheredParameters' updates go through the files; faults are clear errors. (Two gloo ranks:
tests/distributed/test_zero_nvme.py.)"""
import errno
import os

import pytest
import torch

import dsfast
from dsfast.zero import GatheredParameters
from dsfast.zero.nvme import io as nvme_io
from dsfast.zero.nvme.buffers import aligned_size
from dsfast.zero.nvme.files import SWAP_ROOT
from dsfast.zero.nvme.io import SwapError
from dsfast.zero.policy.placement import TEST_PLACEMENT_ENV


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def _cfg(params, states="cpu", precision="fp32", buffer_count=2, max_in_cpu=0, persistence=0, gas=1):
    zero = {"stage": 3, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": persistence}
    zero["offload_param"] = {"device": "cpu"} if params == "cpu" else \
        {"device": "nvme", "nvme_path": params, "buffer_count": buffer_count, "max_in_cpu": max_in_cpu}
    zero["offload_optimizer"] = {"device": "cpu"} if states == "cpu" else \
        {"device": "nvme", "nvme_path": states, "buffer_count": 3}
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
           "gradient_clipping": 0.1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "zero_optimization": zero}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return cfg


def _engine(cfg, model=None):
    model = model or _model()
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def _train(engine, steps, g=None):
    g = g or torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(engine.gradient_accumulation_steps()):
            x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
            engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
            engine.step()
    return engine


def _whole(engine):
    params = list(engine.module.parameters())
    with GatheredParameters(params):
        return [p.detach().clone() for p in params]


def _same(a, b):
    for p, q in zip(_whole(a), _whole(b)):
        assert torch.equal(p, q)


def _file_values(swap, i, rec):
    raw = open(swap.window.path(i), "rb").read()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)[:rec.shard_numel * rec.shard.element_size()] \
        .view(rec.dtype)


@pytest.mark.parametrize("placement", ["", "distinct-host"])   # the second runs every offload copy (placement.py)
@pytest.mark.parametrize("states", ["cpu", "nvme"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_parameters_on_nvme_train_bitwise_as_cpu_offload(tmp_path, monkeypatch, precision, states, placement):
    monkeypatch.setenv(TEST_PLACEMENT_ENV, placement)
    gas = 2 if precision == "fp32" else 1
    keep = 40 if states == "nvme" else 0   # the biases persistent: gathered again after every step, from their files
    ref = _train(_engine(_cfg("cpu", "cpu", precision, gas=gas, persistence=keep)), 4)
    got = _train(_engine(_cfg(str(tmp_path), str(tmp_path) if states == "nvme" else "cpu", precision, gas=gas,
                              persistence=keep)), 4)
    _same(got, ref)
    swap = got.state_owner.param_swap
    assert len(swap.records) == 4 and swap.resident == []   # max_in_cpu 0: every shard swapped
    assert swap.window.peak_in_use <= swap.window.buffer_count == 2
    assert got.state_owner.gathers_through == "collectives"   # (no /dev/shm snapshot of the shards)
    by_name = dict(ref.module.named_parameters())
    for (name, p), (i, rec) in zip(got.module.named_parameters(), enumerate(swap.records)):
        assert rec.param is p
        # between steps the shard is in its file only, equal to CPU offload's shard
        assert rec.shard.untyped_storage().nbytes() == 0 and p.ds_tensor is rec.shard
        assert torch.equal(_file_values(swap, swap.index[id(rec.shard)], rec), by_name[name].ds_tensor)
    where = swap.dir.path
    got.destroy()
    assert not os.path.exists(where) and os.listdir(tmp_path / SWAP_ROOT) == []


def test_reads_follow_the_last_steps_order_and_stay_in_the_window(tmp_path):
    e = _train(_engine(_cfg(str(tmp_path), buffer_count=3)), 2)
    swap = e.state_owner.param_swap
    order = list(swap.trace)
    # forward reads 0..3, backward the last layer's weight and bias first: the order read ahead in
    assert order == [0, 1, 2, 3, 2, 3, 0, 1]
    assert swap.follow and [swap.window.state_of(i) for i in order[:2]] == ["reading", "reading"]
    read = swap.io.bytes_read
    _train(e, 1, torch.Generator().manual_seed(7))
    assert swap.io.bytes_read - read == 8 * 4096   # 8 reads a step, each one page (none twice)
    with torch.no_grad():   # a forward off the order (the last layer alone): no guessing, nothing stuck in the
        e.module[2](torch.randn(2, 33))   # window (the units read ahead for it are dropped when buffers are needed)
    assert not swap.follow
    ref = _train(_train(_engine(_cfg("cpu")), 2), 1, torch.Generator().manual_seed(7))
    _same(_train(e, 1, torch.Generator().manual_seed(9)), _train(ref, 1, torch.Generator().manual_seed(9)))


def test_max_in_cpu_keeps_shards_in_memory_persistent_ones_first(tmp_path):
    # the shards: 33x16 weight (528 -> 528), bias 33 (-> 48), 8x33 weight (264 -> 272), bias 8 (-> 16) elements
    e = _engine(_cfg(str(tmp_path), max_in_cpu=100, persistence=40))
    swap = e.state_owner.param_swap
    resident = [tuple(r.shape) for r in swap.resident]
    assert resident == [(33,), (8,)]   # the persistent biases first (64 elements); neither weight fits after
    assert [tuple(r.shape) for r in swap.records] == [(33, 16), (8, 33)]
    assert all(r.swap is None and r.shard.untyped_storage().nbytes() > 0 for r in swap.resident)
    _same(_train(e, 3), _train(_engine(_cfg("cpu", persistence=40)), 3))
    none = _engine(_cfg(str(tmp_path), max_in_cpu=10 ** 9))   # DeepSpeed's default: this model stays in memory
    assert none.state_owner.param_swap.records == []


def test_checkpoints_save_and_load_with_parameters_on_nvme_and_cross_to_cpu(tmp_path):
    nvme = str(tmp_path / "nvme")
    os.mkdir(nvme)
    g = torch.Generator().manual_seed(1)
    ref = _train(_engine(_cfg("cpu", precision="bf16")), 6, torch.Generator().manual_seed(1))
    first = _train(_engine(_cfg(nvme, nvme, precision="bf16")), 3, g)
    first.save_checkpoint(str(tmp_path / "ck"), tag="t3")
    assert all(r.shard.untyped_storage().nbytes() == 0 for r in first.state_owner.param_swap.records)
    state = g.get_state()
    _train(first, 2, torch.Generator().manual_seed(5))   # moves on: the checkpoint must not follow
    for resume in (_cfg(nvme, nvme, precision="bf16"), _cfg("cpu", precision="bf16"),
                   _cfg(nvme, "cpu", precision="bf16")):
        e = _engine(resume)
        ps = e.state_owner.param_swap
        read = ps.io.bytes_read if ps is not None else 0
        e.load_checkpoint(str(tmp_path / "ck"), tag="t3")
        # every shard is overwritten whole: none read from its file (nor for the ranges the load checks first)
        assert ps is None or ps.io.bytes_read == read
        g.set_state(state)
        _same(_train(e, 3, g), ref)
    cpu = _train(_engine(_cfg("cpu", precision="bf16")), 3, torch.Generator().manual_seed(1))
    cpu.save_checkpoint(str(tmp_path / "ck"), tag="cpu")
    e = _engine(_cfg(nvme, nvme, precision="bf16"))   # and from CPU offload's checkpoint onto NVMe
    e.load_checkpoint(str(tmp_path / "ck"), tag="cpu")
    g.set_state(state)
    _same(_train(e, 3, g), ref)


def test_a_gathered_parameters_update_reaches_the_file_and_the_master(tmp_path):
    def run(params):
        e = _train(_engine(_cfg(params, precision="bf16")), 2)
        with GatheredParameters([e.module[0].weight], modifier_rank=0):
            e.module[0].weight.data.mul_(0.5)
        return _train(e, 2, torch.Generator().manual_seed(3))
    got, ref = run(str(tmp_path)), run("cpu")
    _same(got, ref)
    rec = got.state_owner.param_swap.records[0]
    assert rec.shard.untyped_storage().nbytes() == 0


def test_memory_breakdown_and_progress_count_both_swaps(tmp_path):
    e = _train(_engine(_cfg(str(tmp_path), str(tmp_path), precision="bf16")), 2)
    owner = e.state_owner
    mb = e.memory_breakdown()
    on_disk = owner.swap.dir.nbytes + owner.param_swap.dir.nbytes
    assert mb["total"]["nvme"] == on_disk and owner.param_swap.dir.nbytes >= 4 * 4096
    assert mb["param_swap_window"]["host"] == sum(b.numel() for b in owner.param_swap.host_buffers()) > 0
    assert e.swap_bytes() == tuple(sum(getattr(s.io, k) for s in owner.swaps)
                                   for k in ("bytes_read", "bytes_written"))


def test_a_buffer_size_below_the_largest_shard_is_a_note_and_the_buffers_fit_the_shards(tmp_path, caplog):
    cfg = _cfg(str(tmp_path))
    cfg["zero_optimization"]["offload_param"]["buffer_size"] = 100
    with caplog.at_level("WARNING", logger="dsfast.zero.nvme"):
        e = _train(_engine(cfg), 1)
    assert "offload_param.buffer_size=100 is below the largest parameter shard (528 elements)" in caplog.text
    assert all(b.numel() == 4096 for b in e.state_owner.param_swap.host_buffers())   # 528 fp32: one page


def test_a_missing_nvme_path_for_parameters_is_refused_at_initialize(tmp_path):
    with pytest.raises(ValueError, match=r"offload_param.nvme_path='.*nowhere' does not exist"):
        _engine(_cfg(str(tmp_path / "nowhere")))


def test_too_little_host_memory_for_the_parameter_window_is_refused(tmp_path, monkeypatch):
    from dsfast.zero.nvme import checks as nvme_checks
    monkeypatch.setattr(nvme_checks, "meminfo_available", lambda: 100)
    with pytest.raises(ValueError, match=r"need 8192 bytes .* only 100 bytes .* lower offload_param.buffer_count"):
        _engine(_cfg(str(tmp_path)))   # 2 buffers of the largest shard (528 fp32: one page each)


def test_an_optimizer_that_may_read_across_parameters_is_refused_with_parameters_on_nvme(tmp_path):
    model = _model()
    cfg = _cfg(str(tmp_path))
    del cfg["optimizer"]
    cfg["zero_force_ds_cpu_optimizer"] = False
    with pytest.raises(ValueError, match=r'offload_param.device "nvme" steps the optimizer one unit .*LBFGS'):
        dsfast.initialize(model=model, model_parameters=model.parameters(),
                          optimizer=torch.optim.LBFGS(model.parameters()), config=cfg, dist_init_required=False)
    assert not [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".swap")]


def test_a_failed_parameter_write_names_file_and_step_and_keeps_the_previous_file(tmp_path, monkeypatch):
    e = _train(_engine(_cfg(str(tmp_path), precision="bf16")), 2)
    swap = e.state_owner.param_swap
    before = open(swap.window.path(1), "rb").read()
    real = os.pwritev

    def fails_on_param1(fd, buffers, offset):
        # by file, not by call count: the write-backs run on the I/O pool, in no fixed order
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith("param1.swap"):   # or its .new
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)
    monkeypatch.setattr(nvme_io.os, "pwritev", fails_on_param1)
    with pytest.raises(SwapError, match=r"write of '.*param1\.swap' at step 3 failed: No space left on device"):
        _train(e, 1, torch.Generator().manual_seed(9))
    monkeypatch.undo()
    assert open(swap.window.path(1), "rb").read() == before


def test_states_that_cannot_fit_in_host_memory_are_refused_before_the_first_step(monkeypatch):
    """CPU offload of a model whose optimizer states exceed the host's memory: a clear error at initialize (it
    names the bytes and NVMe offload), not the OOM killer at the first step. 4 ranks share this host."""
    from dsfast.zero.nvme import checks as nvme_checks
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(nvme_checks, "meminfo_available", lambda: 20000)
    # 4 shards (528 + 48 + 272 + 16 = 864 fp32 elements) x 2 Adam moments x 4 bytes = 6912 bytes; x 4 ranks
    with pytest.raises(ValueError, match=r"need 6912 bytes .*4 rank\(s\) on this host: 27648 bytes.* only 20000 "
                                         r"bytes .*offload_optimizer \{\"device\": \"nvme\""):
        _engine(_cfg("cpu"))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")   # 13824 bytes fit
    _train(_engine(_cfg("cpu")), 1)
    sgd = _cfg("cpu")
    sgd["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}   # no momentum: no states to create
    monkeypatch.setattr(nvme_checks, "meminfo_available", lambda: 10)
    _train(_engine(sgd), 1)


class _Built(torch.nn.Module):
    """Initialises its children's weights from its own __init__ (as Hugging Face models do): under zero.Init they
    are gathered for the change and partitioned again."""

    def __init__(self):
        super().__init__()
        self.body = _model()
        for m in self.body:
            if isinstance(m, torch.nn.Linear):
                m.weight.data.mul_(0.5)

    def forward(self, x):
        return self.body(x)


def _built(cfg):
    with dsfast.zero.Init(config_dict_or_path=cfg):
        model = _Built()
    return model


def _train_built(model, cfg, steps=3):
    e = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg, dist_init_required=False)[0]
    return _train(e, steps)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero_init_puts_each_shard_in_its_file_as_it_is_built_and_training_is_bitwise_cpu_offload(tmp_path,
                                                                                                 precision):
    nvme = _cfg(str(tmp_path), str(tmp_path), precision)
    model = _built(nvme)
    recs = [p._dsfast_z3 for p in model.parameters()]
    # never whole in memory: every fp32 shard already in its file, the initialisation's change included
    assert all(r.swap is not None and r.shard.untyped_storage().nbytes() == 0 for r in recs)
    assert all(r.dtype == torch.float32 for r in recs)
    got = _train_built(model, nvme)
    swap = got.state_owner.param_swap
    assert recs[0].swap is swap and all(r.dtype == got.module.body[0].weight.dtype for r in recs)
    for r in swap.records:   # the files now hold the model dtype (16-bit: the cast went through them)
        size, want = os.path.getsize(swap.window.path(swap.index[id(r.shard)])), r.shard_numel * r.dtype.itemsize
        assert size == aligned_size(want)
    ref = _train_built(_built(_cfg("cpu", precision=precision)), _cfg("cpu", precision=precision))
    _same(got, ref)
    # zero.Init on NVMe, then a run that keeps the parameters in memory: they come back, training unchanged
    back = _train_built(_built(nvme), _cfg("cpu", precision=precision))
    assert back.state_owner.param_swap is None and all(p._dsfast_z3.swap is None for p in back.module.parameters())
    _same(back, ref)
    got.destroy()
    assert os.listdir(tmp_path / SWAP_ROOT) == [] or all(
        not f.endswith("rank0") or not os.listdir(tmp_path / SWAP_ROOT / f) for f in os.listdir(tmp_path / SWAP_ROOT))


def test_zero_init_on_nvme_then_max_in_cpu_brings_the_kept_shards_back(tmp_path):
    cfg = _cfg(str(tmp_path), max_in_cpu=100, persistence=40, precision="bf16")
    got = _train_built(_built(cfg), cfg)
    swap = got.state_owner.param_swap
    assert [tuple(r.shape) for r in swap.resident] == [(33,), (8,)]
    assert all(r.swap is None and r.shard.untyped_storage().nbytes() > 0 for r in swap.resident)
    assert len(swap.records) == 2 and len(os.listdir(swap.dir.path)) >= 2
    ref = _train_built(_built(_cfg("cpu", persistence=40, precision="bf16")), _cfg("cpu", persistence=40,
                                                                                  precision="bf16"))
    _same(got, ref)
