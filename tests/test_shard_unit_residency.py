"""The shard unit knows its residency (memory or an NVMe file behind its states and its 16-bit slice) and readiness
(its states in host memory now): what the NVMe placements set and the step's walk asks (zero/units/shard_unit.py)."""
import torch

import dsfast


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def _engine(zero):
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": zero}
    model = _model()
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def _train(engine):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
    engine.step()


def test_stage3_units_on_nvme_know_their_files_and_are_unloaded_between_steps(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "s").mkdir()
    e = _engine({"stage": 3, "reduce_bucket_size": 300, "stage3_param_persistence_threshold": 40,
                 "offload_param": {"device": "nvme", "nvme_path": str(tmp_path / "p"), "max_in_cpu": 100},
                 "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "s"), "buffer_count": 3}})
    owner = e.state_owner
    units = owner.units
    # max_in_cpu keeps the persistent biases (33 and 8 elements) in memory; the weights live in files
    assert [u.param_swap is owner.param_swap for u in units] == [u.slice16.numel() > 100 for u in units]
    assert sum(u.param_swap is None for u in units) == 2
    _train(e)
    for u in units:
        assert u.states_swap is owner.swap and not u.resident
        assert not u.states_loaded and u.shard.untyped_storage().nbytes() == 0   # in its file only
        assert [key for key, *_ in u.states_layout] == ["master", "exp_avg", "exp_avg_sq"]
    swapped = next(u for u in units if u.param_swap is not None)
    assert swapped.slice16.untyped_storage().nbytes() == 0
    with swapped.writing16():   # a buffer to write into, written to the file after
        assert swapped.slice16.untyped_storage().nbytes() > 0
        values = swapped.slice16.clone()
    assert swapped.slice16.untyped_storage().nbytes() == 0
    assert torch.equal(owner.param_swap.copy_of(next(r for r in owner.param_swap.records
                                                     if r.shard is swapped.slice16), trace=False), values)


def test_units_in_memory_are_resident_and_always_loaded():
    e = _engine({"stage": 2, "offload_optimizer": {"device": "cpu"}})
    _train(e)
    for u in e.state_owner.units:
        assert u.resident and u.states_loaded and u.states_layout is None and u.states_swap is None
        with u.writing16():   # nothing to do: the slice is its own memory
            assert u.slice16.untyped_storage().nbytes() > 0


def _batches_and_checks(engine, monkeypatch):
    """(sizes of the batches the step's walk handed the optimizer, hyperparameter checks) over one step."""
    from dsfast.zero.step import apply as shard_step
    sizes, checks = [], []
    real_prepare, opt = shard_step.prepare_step, engine.optimizer
    real_check = type(opt)._group_hyperparameters

    def prepare(optimizer, **kw):
        step = real_prepare(optimizer, **kw)
        return lambda parts: sizes.append(sum(len(idx) for idx, _, _ in parts)) or step(parts)
    monkeypatch.setattr(shard_step, "prepare_step", prepare)
    monkeypatch.setattr(type(opt), "_group_hyperparameters", lambda self, g: checks.append(1) or real_check(self, g))
    _train(engine)
    return sizes, len(checks)


def test_the_host_step_is_the_nvme_walk_with_every_unit_resident(tmp_path, monkeypatch):
    in_memory = _engine({"stage": 3, "reduce_bucket_size": 300, "offload_optimizer": {"device": "cpu"}})
    units = len(in_memory.state_owner.units)
    groups = len(in_memory.optimizer.param_groups)
    assert _batches_and_checks(in_memory, monkeypatch) == ([units], groups)   # one batch of every unit
    monkeypatch.undo()
    (tmp_path / "s").mkdir()
    on_nvme = _engine({"stage": 3, "reduce_bucket_size": 300,
                       "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "s"), "buffer_count": 3}})
    # one unit per batch, and still one check of the hyperparameters per group for the whole step
    assert _batches_and_checks(on_nvme, monkeypatch) == ([1] * units, groups)
