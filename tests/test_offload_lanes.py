"""The offload copies on lanes (issue 28): each unit's reduced gradient goes to the host on the d2h lane and its
updated 16-bit values come back on the h2d lane, each with its own event (ShardUnit.grad_event / step_event), and
every reader waits for the event of the unit it reads.

Under the test placement (DSFAST_TEST_PLACEMENT=distinct-host) the lanes are worker threads, so a copy really lands
later than its submission; the chaos mode (DSFAST_STREAM_CHAOS=<seed>) delays every copy by a random time, so that a
missing wait reads a stale or half-written buffer. Training must then be bitwise what the same run gives with chaos
off and what the ordinary CPU placement (no copies at all) gives: copies move values, they never change them.
tests/lane_inject_bugs.py removes each wait in turn and shows these tests fail.
"""
import threading
import time

import pytest
import torch

import dsfast
from dsfast.accelerator.streams import CHAOS_ENV, CHAOS_MS_ENV, DoneEvent, LaneError, ThreadEvent, ThreadLane
from dsfast.utils import safe_get_full_fp32_param, safe_set_full_grad
from dsfast.zero.policy.placement import TEST_PLACEMENT_ENV, Placement

CHAOS_SEED, CHAOS_MS = "11", "4"   # copies land up to 4 ms late: longer than this model's step or forward


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 40), torch.nn.GELU(), torch.nn.Linear(40, 24),
                               torch.nn.GELU(), torch.nn.Linear(24, 8))


def _cfg(stage, precision, offload="cpu", gas=2):
    zero = {"stage": stage, "reduce_bucket_size": 400}   # several buckets (units) at stages 1-2
    if offload == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
    elif offload is not None:   # an NVMe path
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": offload, "buffer_count": 3}
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
           "gradient_clipping": 0.1, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


def _train(cfg, steps=3, overflow_first=False):
    """(losses, full fp32 masters, model-dtype parameters as the forward sees them) after `steps` optimizer steps.
    overflow_first: the first backward's loss is inf (an fp16 overflow: that step is skipped)."""
    model = _model()
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    g = torch.Generator().manual_seed(1)
    losses = []
    for i in range(steps * cfg["gradient_accumulation_steps"]):
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x).float(), y)
        engine.backward(loss * float("inf") if overflow_first and i == 0 else loss)
        engine.step()
        losses.append(loss.detach().clone())
    masters = [safe_get_full_fp32_param(p).clone() for p in engine.module.parameters()]
    with dsfast.zero.GatheredParameters(list(engine.module.parameters())):
        seen = [p.detach().clone() for p in engine.module.parameters()]
    return engine, (losses, masters, seen)


def _run(monkeypatch, cfg, placement, chaos, **train):
    for name, value in ((TEST_PLACEMENT_ENV, placement), (CHAOS_ENV, chaos), (CHAOS_MS_ENV, CHAOS_MS)):
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    return _train(cfg, **train)


def _same(got, want):
    for a, b in zip(got, want):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and torch.equal(x, y)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_copies_on_lanes_under_chaos_train_bitwise_as_without(monkeypatch, stage, precision):
    cfg = _cfg(stage, precision)
    _, plain = _run(monkeypatch, cfg, None, None)
    _, calm = _run(monkeypatch, cfg, "distinct-host", None)
    engine, chaotic = _run(monkeypatch, cfg, "distinct-host", CHAOS_SEED)
    _same(calm, plain)
    _same(chaotic, plain)
    # internals on purpose: the copies really went through worker-thread lanes, one event per unit
    store = engine.state_owner.store
    assert isinstance(store.lanes.device_lane("d2h"), ThreadLane) and store.lanes.chaos is not None
    assert len(store.units) > 1 and all(isinstance(u.grad_event, ThreadEvent) for u in store.units)
    # every upload landed before step() returned (the serial step)
    assert isinstance(store.upload_lane(), ThreadLane)
    assert all(isinstance(u.step_event, ThreadEvent) and u.step_event.query() for u in store.units)
    # the staging buffers are exactly the size of what they hold (pinned too, with a GPU: placement.host_empty)
    assert all(u.host_grad.numel() == u.grad.numel() for u in store.units)
    if precision == "bf16":
        assert all(u.host16.shape == u.slice16.shape for u in store.units)
    if stage == 3:
        assert sum(b.numel() for b in store.bucket_host) == sum(u.grad.numel() for u in store.units)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_skipped_fp16_step_under_chaos_trains_bitwise_as_without(monkeypatch, stage):
    # the first step overflows: nothing is uploaded, and the next steps read the new gradients, not stale ones
    cfg = _cfg(stage, "fp16", gas=1)
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    _, plain = _run(monkeypatch, cfg, None, None, overflow_first=True)
    engine, chaotic = _run(monkeypatch, cfg, "distinct-host", CHAOS_SEED, overflow_first=True)
    assert engine.skipped_steps == 1 and engine.global_steps == 3
    _same(chaotic, plain)


def test_the_step_waits_per_unit_never_for_a_whole_lane_or_stream(monkeypatch):
    def whole(*args, **kwargs):
        raise AssertionError("the step waited for everything at once")
    monkeypatch.setattr(ThreadLane, "drain", whole)
    monkeypatch.setattr(Placement, "synchronize", whole)
    for stage in (1, 2, 3):
        _run(monkeypatch, _cfg(stage, "bf16"), "distinct-host", CHAOS_SEED)   # (raises if it did)


def test_nvme_copies_on_lanes_under_chaos_train_bitwise_as_cpu_offload(monkeypatch, tmp_path):
    # fp32 at stage 1: the upload reads the master in its window buffer, which goes to disk behind the step
    cfg = _cfg(1, "fp32", offload=str(tmp_path))
    _, plain = _run(monkeypatch, _cfg(1, "fp32"), None, None)
    _, calm = _run(monkeypatch, cfg, "distinct-host", None)
    engine, chaotic = _run(monkeypatch, cfg, "distinct-host", CHAOS_SEED)
    _same(calm, plain)
    _same(chaotic, plain)
    assert len(engine.state_owner.swap.units) > 1
    engine.destroy()


def test_stage3_offload_param_keeps_its_host_shards_off_the_upload_lane(monkeypatch):
    # the 16-bit shards are host memory there: the optimizer writes them, nothing to upload; gradients still copy
    cfg = _cfg(3, "bf16")
    cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    _, plain = _run(monkeypatch, cfg, None, None)
    engine, chaotic = _run(monkeypatch, cfg, "distinct-host", CHAOS_SEED)
    _same(chaotic, plain)
    store = engine.state_owner.store
    assert store.upload_lane() is None and all(isinstance(u.step_event, DoneEvent) for u in store.units)
    assert all(isinstance(u.grad_event, ThreadEvent) for u in store.units)


def test_stage3_gather_waits_for_the_units_upload_in_flight(monkeypatch):
    # an upload of new 16-bit values still in flight when the next forward gathers the shard (what the overlapped
    # step leaves behind): the gather must read the new values, not the old ones
    cfg = _cfg(3, "bf16", gas=1)
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0   # every parameter gathered by forward
    engine, _ = _run(monkeypatch, cfg, "distinct-host", None)
    store = engine.state_owner.store
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5))
    with dsfast.zero.GatheredParameters(list(engine.module.parameters())):
        new = [p.detach().clone() * 0.5 for p in engine.module.parameters()]
    reference = _model().to(torch.bfloat16)
    with torch.no_grad():
        for p, v in zip(reference.parameters(), new):
            p.copy_(v)
    want = reference(x.to(torch.bfloat16))
    lane = store.upload_lane()
    for u, v in zip(store.units, new):
        a, b = u.plan.shard_range(store.rank)
        values = torch.zeros_like(u.slice16)
        values[:min(b, v.numel()) - a].copy_(v.reshape(-1)[a:min(b, v.numel())])

        def upload(dst=u.slice16, src=values):
            time.sleep(0.02)   # lands well after the forward would have gathered without waiting
            dst.copy_(src)
        u.step_event = lane.submit(upload, "test upload")
    got = engine(x)
    assert torch.equal(got, want)


def test_a_failed_upload_is_raised_by_step_naming_the_unit(monkeypatch):
    cfg = _cfg(2, "bf16", gas=1)
    engine, _ = _run(monkeypatch, cfg, "distinct-host", None)
    lane = engine.state_owner.store.upload_lane()
    submit = lane.submit

    def failing(fn, what="", after_current=True):   # the copy of unit 1 fails (a device error, say)
        def boom():
            raise OSError("device lost")
        return submit(boom if "unit 1 " in what else fn, what, after_current)
    monkeypatch.setattr(lane, "submit", failing)
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
    with pytest.raises(LaneError, match="updated 16-bit values of unit 1 to the device: OSError: device lost"):
        engine.step()


def test_a_grad_setter_waits_for_the_units_copy_in_flight(monkeypatch):
    # safe_set_full_grad between backward and step writes the gradient and its host copy; a copy still in flight
    # would land after it and put the old gradient back in the host copy the optimizer reads
    cfg = _cfg(2, "fp32", gas=1)
    engine, _ = _run(monkeypatch, cfg, "distinct-host", None)
    owner = engine.state_owner
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
    p = next(engine.module.parameters())
    plan, _ = owner.store.bucket_of[id(p)]
    u = owner.store.units[plan.index]
    gate = threading.Event()
    lane = owner.store.lanes.device_lane("d2h")
    lane.submit(gate.wait, "test gate")
    stale = torch.full_like(u.host_grad, 7.0)
    u.grad_event = lane.submit(lambda: u.host_grad.copy_(stale), "test copy")
    threading.Timer(0.05, gate.set).start()
    value = torch.full(p.shape, 0.25)
    safe_set_full_grad(p, value)
    a, b = plan.shard_range(owner.rank)
    e = owner.store.bucket_of[id(p)][1]
    lo, hi = max(a, e.offset), min(b, e.offset + e.numel)
    assert lo < hi
    u.grad_event.wait()   # whatever was in flight has landed: the host copy the optimizer reads has the new values
    assert torch.equal(u.host_grad[lo - a:hi - a], torch.full((hi - lo,), 0.25))
    assert torch.equal(u.grad[lo - a:hi - a], torch.full((hi - lo,), 0.25))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_destroy_stops_the_lanes_threads(monkeypatch, stage):
    """Under the test placement the copy lanes are worker threads: engine.destroy() runs what they hold and stops
    them (none left behind per engine)."""
    monkeypatch.setenv("DSFAST_TEST_PLACEMENT", "distinct-host")
    before = {t.ident for t in threading.enumerate() if t.name.startswith("dsfast-lane-")}
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cfg = {"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}, "bf16": {"enabled": True},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 100, "offload_optimizer": {"device": "cpu"}}}
    engine, *_ = dsfast.initialize(model=m, model_parameters=m.parameters(), config=cfg, dist_init_required=False)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    engine.backward(engine(x).float().square().mean())
    engine.step()
    lanes = [t for t in threading.enumerate() if t.name.startswith("dsfast-lane-") and t.ident not in before]
    assert lanes, "the test placement made no lane threads (nothing to stop)"
    engine.destroy()
    assert not any(t.is_alive() for t in lanes)
