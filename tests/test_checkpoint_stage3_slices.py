"""ZeRO stage 3 checkpoints hold the module weights as every rank's own slice (checkpoint/module_slices.py): no
rank gathers the model to save it. One process here (the distributed cases are in
tests/distributed/test_zero_checkpoint.py): the files and manifest, loads at stage 3 and at another stage, bf16
weights, `dsfast consolidate`, and the errors (a corrupted slice file, weights this model does not have)."""
import os

import pytest
import torch

import dsfast
from dsfast.checkpoint.consolidate import consolidate
from dsfast.checkpoint.errors import CheckpointCorruptError, CheckpointError
from dsfast.checkpoint.load import CheckpointReader, resolve
from dsfast.utils import safe_get_full_fp32_param
from test_zero3_engine import _cfg3
from test_zero_engine import _cfg, _model, _train


class WithBuffer(torch.nn.Module):
    """A model with a persistent buffer (it stays in rank 0's module file) and a frozen layer."""

    def __init__(self):
        super().__init__()
        self.net = _model()
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.register_buffer("count", torch.arange(5, dtype=torch.float32))

    def forward(self, x):
        return self.frozen(self.net(x))


def _whole(engine):
    """The module's whole weights in its dtype (gathered at stage 3; a no-op at other stages)."""
    params = list(engine.module.parameters())
    with dsfast.zero.GatheredParameters(params):
        return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _saved(tmp_path, precision="fp32"):
    torch.manual_seed(0)
    engine = _train(_cfg3(precision), steps=3, model=WithBuffer())
    engine.module.count.add_(1.0)
    engine.save_checkpoint(tmp_path)
    path, _ = resolve(tmp_path, None)
    return engine, path


def test_stage3_saves_each_ranks_slice_and_rank0_keeps_only_the_buffers(tmp_path):
    engine, path = _saved(tmp_path)
    reader = CheckpointReader(path)
    m = reader.manifest
    assert set(reader.file(m["module_file"]).keys()) == {"count"}
    names = [n for n, _ in engine.module.named_parameters()]
    assert sorted(m["module_params"]) == sorted(names)
    for name in names:
        (s,) = m["module_params"][name]["slices"]      # one rank: one slice of each, in its own file
        assert s["file"] == "model_rank00000.safetensors" and s["rank"] == 0
    whole = reader.module_state()
    want = _whole(engine)
    for name in names:
        assert torch.equal(whole[name], want[name]), name
    assert torch.equal(whole["count"], torch.arange(5, dtype=torch.float32) + 1)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stage3_loads_its_own_slices_and_another_stage_joins_them(tmp_path, precision):
    engine, path = _saved(tmp_path, precision)
    want = _whole(engine)
    for cfg in (_cfg3(precision), _cfg(0, precision), _cfg(2, precision)):
        torch.manual_seed(5)   # other initial weights: the load must replace them
        fresh = dsfast.initialize(model=WithBuffer(), config=cfg, dist_init_required=False)[0]
        fresh.load_checkpoint(tmp_path)
        got = _whole(fresh)
        for name, value in want.items():
            assert torch.equal(got[name], value), (cfg["zero_optimization"]["stage"], name)
        assert torch.equal(fresh.module.count, engine.module.count)


def test_consolidate_reads_the_frozen_weights_from_the_slices(tmp_path):
    engine, path = _saved(tmp_path, "bf16")
    sd = consolidate(tmp_path)
    for name, p in engine.module.named_parameters():   # trained ones from the fp32 masters
        if p.requires_grad:
            assert torch.equal(sd[name], safe_get_full_fp32_param(p)), name
    whole = _whole(engine)
    for name in ("frozen.weight", "frozen.bias"):      # the frozen layer from its bf16 slices
        assert sd[name].dtype == torch.float32 and torch.equal(sd[name], whole[name].float()), name


def test_a_corrupted_slice_file_fails_the_load_before_anything_changes(tmp_path):
    _, path = _saved(tmp_path)
    target = os.path.join(path, "model_rank00000.safetensors")
    with open(target, "r+b") as f:
        f.truncate(os.path.getsize(target) - 8)
    torch.manual_seed(5)
    fresh = dsfast.initialize(model=WithBuffer(), config=_cfg3(), dist_init_required=False)[0]
    before = _whole(fresh)
    with pytest.raises(CheckpointCorruptError, match="model_rank00000.safetensors"):
        fresh.load_checkpoint(tmp_path)
    after = _whole(fresh)
    assert all(torch.equal(after[n], before[n]) for n in before)


def test_weights_this_model_does_not_have_are_refused_unless_not_strict(tmp_path):
    _saved(tmp_path)

    class Other(WithBuffer):
        def __init__(self):
            super().__init__()
            self.extra = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.extra(super().forward(x))

    fresh = dsfast.initialize(model=Other(), config=_cfg3(), dist_init_required=False)[0]
    with pytest.raises(CheckpointError, match=r"missing \['extra.weight', 'extra.bias'\]"):
        fresh.load_checkpoint(tmp_path, load_optimizer_states=False, load_module_only=True)
    with pytest.warns(UserWarning, match="load_module_strict=False"):
        fresh.load_checkpoint(tmp_path, load_module_strict=False, load_module_only=True)
