"""Every state owner speaks the whole StateOwner protocol (dsfast/zero/owner.py), in one process.

Each owner (stages 0-3; the optimizer in memory, offloaded to the host, or on NVMe, where the stage allows; fp32
and bf16) is built by initialize() on a tiny model with a frozen parameter, trained two steps, then every member
is checked for what the protocol says it answers: types, shapes, values against the module's weights and a plain
torch gradient, round trips (full vs local, checkpoint_layout vs full_fp32_param, after_checkpoint_load), and the
answers where a member does not apply (no NVMe, no partitioned parameters). Tolerances: fp32 values are compared
exactly where they are the same tensors, gradients to 1e-6 against torch; bf16 values against their fp32 masters
cast to bf16 (exactly: the step writes that cast).
"""
import inspect
import os

import pytest
import torch

import dsfast
from dsfast.zero.nvme.params import NvmeParams
from dsfast.zero.nvme.states import NvmeStates
from dsfast.zero.policy.precision import PrecisionPolicy
from dsfast.zero.owner import SliceRecord, StateOwner, memory_breakdown
from dsfast.zero.units.shard_unit import ShardUnit

CASES = [(0, "none", p) for p in ("fp32", "bf16")] + \
    [(stage, offload, p) for stage in (1, 2, 3) for offload in ("none", "cpu", "nvme") for p in ("fp32", "bf16")]
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def protocol_members():
    """The names StateOwner declares: its attributes and its methods."""
    methods = [n for n, v in vars(StateOwner).items() if inspect.isfunction(v) and not n.startswith("_")]
    return sorted(set(StateOwner.__annotations__) | set(methods))


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 4))
    model[2].bias.requires_grad_(False)   # a frozen parameter: not trained, still in the module's weights
    return model


def _config(stage, offload, precision, nvme_dir):
    zero = {"stage": stage, "reduce_bucket_size": 64}   # several buckets (units) below stage 3
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
    elif offload == "nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme_dir, "buffer_count": 2}
        if stage == 3:
            zero["offload_param"] = {"device": "nvme", "nvme_path": nvme_dir, "buffer_count": 2,
                                     "max_in_cpu": 0}
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0   # every parameter partitioned
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def _batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)


def _loss(module, x, y, dtype):
    return torch.nn.functional.mse_loss(module(x.to(dtype)).float(), y)


def _whole(engine):
    """{name: the module's whole weights} (gathered at stage 3), detached copies."""
    with dsfast.zero.GatheredParameters(list(engine.module.parameters())):
        return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _covers_once(ranges_of, numel_of):
    """Every name's [start, stop) ranges cover [0, numel) exactly once (one rank: the whole parameter).
    ranges_of: (name, start, stop) of each record (not the records: a failure report would print their tensors,
    which on NVMe have no storage between uses)."""
    by_name = {}
    for name, start, stop in ranges_of:
        by_name.setdefault(name, []).append((start, stop))
    assert sorted(by_name) == sorted(numel_of)
    for name, ranges in by_name.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == numel_of[name], (name, ranges)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (name, ranges)


@pytest.mark.parametrize("stage,offload,precision", CASES)
def test_every_owner_answers_the_protocol(tmp_path, stage, offload, precision):
    model = _model()
    engine = dsfast.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                               config=_config(stage, offload, precision, str(tmp_path)), dist_init_required=False)[0]
    owner, dtype = engine.state_owner, DTYPE[precision]
    params = dict(engine.module.named_parameters())
    trained = {n: p for n, p in params.items() if p.requires_grad}
    names = {id(p): n for n, p in params.items()}
    shapes = {n: tuple(p.ds_shape) if stage == 3 else tuple(p.shape) for n, p in params.items()}

    # every member is there, on every owner
    missing = [m for m in protocol_members() if not hasattr(owner, m)]
    assert missing == [], f"stage {stage} owner ({type(owner).__name__}) lacks {missing}"
    assert owner.settle() is None and owner.settle(agree=True) is None   # (no overlap_step: nothing in flight)

    # what the owner is
    assert owner.stage == stage
    assert isinstance(owner.precision, PrecisionPolicy) and owner.precision.name == precision
    assert owner.precision.dtype == (None if precision == "fp32" else dtype)
    assert owner.post_reduce_factor == 1.0   # one rank
    assert owner.partitions_params is (stage == 3)
    assert owner.reduces_every_micro_step is (stage >= 2)
    assert owner.trains is True
    assert owner.reducer.transport == "local"
    assert owner.gathers_through == (None if stage < 3 else "collectives")
    assert isinstance(owner.swap, NvmeStates) if offload == "nvme" else owner.swap is None
    assert isinstance(owner.param_swap, NvmeParams) if (offload, stage) == ("nvme", 3) else owner.param_swap is None
    assert owner.swaps == [s for s in (owner.swap, owner.param_swap) if s is not None]
    # the units the optimizer steps: one per optimizer parameter, in its order (none at stage 0)
    assert [id(u.shard) for u in owner.units] == ([] if stage == 0 else
                                                  [id(p) for g in engine.optimizer.param_groups for p in g["params"]])
    assert all(isinstance(u, ShardUnit) for u in owner.units)
    assert stage != 3 or [u.slice16.numel() for u in owner.units] == [p.ds_tensor.numel() for p in trained.values()]
    assert owner.optimizer_device == (None if stage == 0 else torch.device("cpu"))
    built = owner.optimizer_groups(list(trained.values()))   # what the engine's optimizer was built over
    built = [p for g in built for p in (g["params"] if isinstance(g, dict) else [g])]
    assert [id(p) for p in built] == [id(p) for g in engine.optimizer.param_groups for p in g["params"]]

    # a step through the engine (begin_backward, end_backward, prepare_step, step), then a gradient to read
    for i in range(2):
        engine.backward(_loss(engine, *_batch(i), dtype))
        engine.step()
    assert engine.was_step_applied()
    assert owner.collectives_launched == owner.reducer.collectives_launched >= 0
    weights = _whole(engine)
    ref = _model()
    with torch.no_grad():
        for n, q in ref.named_parameters():
            q.copy_(weights[n].float())
    x, y = _batch(7)
    _loss(ref, x, y, torch.float32).backward()
    engine.backward(_loss(engine, x, y, dtype))   # reduced (one rank: a boundary), not stepped yet

    # the full and local views, against the module's weights, torch's gradient and each other
    for n, p in trained.items():
        full = owner.full_fp32_param(p)
        assert full.dtype == torch.float32 and tuple(full.shape) == shapes[n]
        assert torch.equal(full.to(dtype), weights[n]), n   # the step wrote the master's cast into the module
        assert torch.equal(owner.local_fp32_param(p).float().reshape(-1), full.reshape(-1)), n
        grad = owner.full_grad(p)
        assert grad.dtype == torch.float32 and tuple(grad.shape) == shapes[n]
        if precision == "fp32":
            torch.testing.assert_close(grad, ref.get_parameter(n).grad, atol=1e-6, rtol=1e-5)
        else:   # a bf16 forward: the same gradient to bf16's precision
            torch.testing.assert_close(grad, ref.get_parameter(n).grad, atol=2e-2, rtol=5e-2)
        assert torch.equal(owner.local_grad(p).float().reshape(-1), grad.reshape(-1)), n
        avg = owner.full_optimizer_state(p, "exp_avg")
        assert avg.dtype == torch.float32 and tuple(avg.shape) == shapes[n] and avg.abs().sum() > 0
        assert torch.equal(owner.local_optimizer_state(p, "exp_avg").float().reshape(-1), avg.reshape(-1)), n
        with pytest.raises(KeyError, match="'nope' does not exist.*exp_avg"):
            owner.full_optimizer_state(p, "nope")
    owner.zero_grads()
    assert all(owner.full_grad(p).abs().sum() == 0 for p in trained.values())

    # checkpoints: the layout covers every trained parameter once, and its slices hold the masters
    layout = owner.checkpoint_layout(names)
    assert all(isinstance(r, SliceRecord) and r.shape == shapes[r.name] for r in layout)
    numel = {n: p.ds_numel if stage == 3 else p.numel() for n, p in trained.items()}
    _covers_once([(r.name, r.start, r.stop) for r in layout], numel)
    fulls = {n: owner.full_fp32_param(p).reshape(-1) for n, p in trained.items()}   # (outside the visit: on
    with owner.visiting(writes=False) as use:                                       # NVMe one unit at a time)
        for r in layout:
            use(r.opt_param)
            got = r.opt_param.detach().view(-1)[r.opt_offset:r.opt_offset + r.stop - r.start].float()
            assert torch.equal(got, fulls[r.name][r.start:r.stop]), r.name
    visitor = owner.states_visitor(writes=False)
    assert (visitor is None) is (offload != "nvme")
    if visitor is not None:
        visitor.close()
    slices = owner.module_slices(names)
    if stage < 3:
        assert slices == []   # whole parameters on every rank: rank 0 saves the module
    else:   # every parameter, trained or frozen, in the model's dtype
        _covers_once([(r.name, r.start, r.stop) for r in slices], {n: p.ds_numel for n, p in params.items()})
        for r in slices:
            values = r.opt_param.detach().view(-1)[r.opt_offset:r.opt_offset + r.stop - r.start]
            assert values.dtype == dtype and torch.equal(values, weights[r.name].reshape(-1)[r.start:r.stop])
        assert [(r.name, r.start) for r in owner.module_slices(names, values=False)] == \
            [(r.name, r.start) for r in slices]
        assert sorted({r.name for r in owner.module_slices(names, exclude_frozen=True)}) == sorted(trained)
    owner.after_checkpoint_load()   # masters -> module: the values they already hold
    assert all(torch.equal(v, weights[n]) for n, v in _whole(engine).items())

    # a partitioned shard written in place: the master follows (stage 3); below it, nothing to follow
    first = trained["0.weight"]
    if stage < 3:
        owner.shard_changed(first)
        assert torch.equal(owner.full_fp32_param(first), fulls["0.weight"].view(shapes["0.weight"]))
    else:
        with dsfast.zero.GatheredParameters([first], modifier_rank=0):   # calls shard_changed on the way out
            with torch.no_grad():
                first.fill_(0.5)
        assert torch.equal(owner.full_fp32_param(first), torch.full(shapes["0.weight"], 0.5))
        weights["0.weight"] = torch.full(shapes["0.weight"], 0.5, dtype=dtype)

    # memory: the owner's tensors, counted by memory_breakdown
    cats = owner.memory_tensors()
    assert {"params", "masters", "grads", "optimizer_states", "comm_buffers"} <= set(cats)
    assert all(torch.is_tensor(t) for ts in cats.values() for t in ts)
    assert ("swap_window" in cats) is (offload == "nvme") and ("param_swap_window" in cats) is (owner.param_swap
                                                                                                 is not None)
    counted = memory_breakdown(cats)
    assert counted["total"]["host"] > 0
    if offload == "nvme":   # the states are in their files between steps; the window holds the host part
        assert counted["optimizer_states"] == {} and counted["swap_window"]["host"] > 0
    else:
        assert counted["optimizer_states"]["host"] > 0

    # a client optimizer that stepped already cannot be re-pointed at ZeRO's shards
    if stage > 0:
        with pytest.raises(ValueError, match=f"already has state; under ZeRO stage {stage}"):
            owner.adopt_client_optimizer(engine.optimizer, list(trained.values()))

    # stage 3 gives back what stays gathered; detach leaves an ordinary module with whole weights
    owner.empty_partition_cache()
    if stage == 3:
        assert all(p.numel() == 0 for p in params.values())
    final = _whole(engine)
    files = [s.dir.path for s in owner.swaps]
    engine.destroy()   # owner.detach(), and the NVMe swaps closed: their files gone
    assert len(files) == len(owner.swaps) and not any(os.path.exists(f) for f in files)
    for n, p in engine.module.named_parameters():
        assert tuple(p.shape) == shapes[n] and torch.equal(p.detach(), final[n]), n
