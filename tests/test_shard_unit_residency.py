"""The shard unit knows its residency (memory or an NVMe file behind its states and its 16-bit slice) and readiness
(its states in host memory now): what the NVMe placements set and the step's walk asks (zero/shard_unit.py)."""
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
    units = owner.store.units
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
    for u in e.state_owner.store.units:
        assert u.resident and u.states_loaded and u.states_layout is None and u.states_swap is None
        with u.writing16():   # nothing to do: the slice is its own memory
            assert u.slice16.untyped_storage().nbytes() > 0
