"""The equivalence matrix: every ZeRO stage, with and without optimizer offload, every kind of optimizer, every
precision, on 2 gloo ranks, against one process at stage 0 on the same global batches (clipping on, GAS 2).

All stages step through one decision (zero/step/decide.py) and one optimizer contract (optim/amp_step.py); this is what
holds them to one answer. fp32 must agree within 1e-5 (float32 rounding of another summation order). bf16/fp16
reduce and accumulate 16-bit gradients at ZeRO stages (fp32 buckets at stage 0), so they are held to a relative
distance of the parameters (2e-2 bf16, 5e-3 fp16: measured here well below) and to identical parameters on both
ranks. Then the decisions that used to differ between stages: an fp16 overflow on one rank skips the step on every
rank at every stage, and a finite bf16 gradient of ~1e22 (its square overflows fp32) is applied at every stage,
clipped to the same parameters. A plain loss.backward() (DeepSpeed 0.19.8's output hooks) trains as
engine.backward(loss) does at stages 1-3. Last, the offloaded runs again under the test placement that keeps host and device
memory apart on CPU ranks (zero/policy/placement.py): every offload copy runs, and the results are bitwise the same.
"""
import functools
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402
from zero_common import compare_to_reference, full_params, parse, train  # noqa: E402

OPTIMIZERS = ["adam", "config", "nesterov", "torch_adam", "fused_adam"]
PRECISIONS = ["fp32", "bf16", "fp16"]
PLACEMENTS = [(0, False), (1, False), (1, True), (2, False), (2, True), (3, False), (3, True)]
STEPS = 3


def _text(stage, offload, optimizer, precision):
    return f"m{stage}{int(offload)}{optimizer}{precision}:{stage}:{precision}:{int(offload)}:2:0.05:{STEPS}:plain:" \
           f"{optimizer}:-1"


MATRIX = {(s, o, opt, prec): _text(s, o, opt, prec) for s, o in PLACEMENTS for opt in OPTIMIZERS for prec in PRECISIONS}
SKIP = {s: f"skip{s}:{s}:fp16:0:1:0.05:3:plain:config:1" for s in range(4)}
HUGE = {s: f"huge{s}:{s}:bf16:0:1:1.0:3:plain:config:0:huge" for s in range(4)}


DISTINCT = {k: t for k, t in MATRIX.items() if k[1] and k[2] in ("config", "torch_adam", "fused_adam")}
COMM32 = {(s, o): f"comm{s}{int(o)}:{s}:bf16:{int(o)}:2:0.05:{STEPS}:plain:config:-1:inf:engine:fp32"
          for s, o in PLACEMENTS if s > 0}
PLAIN = {(s, prec): f"plain{s}{prec}:{s}:{prec}:0:2:0.05:{STEPS}:plain:config:-1:inf:plain"
         for s in (1, 2, 3) for prec in PRECISIONS}

# Gradients that do not arrive once each in bucket order: Reuse (a layer inside a reentrant checkpoint and again
# outside it: two gradients in one backward, the second after its bucket may be reduced) with hidden size 1024 and
# the default bucket (several buckets), and with hidden size 32 and a 64-element bucket (one bucket per tensor);
# Swapped (buckets complete in the reverse of their order); two engine.backward calls per micro-step.
ODD_GRADS = {**{(s, o, prec, model): f"odd{s}{int(o)}{prec}{model}:{s}:{prec}:{int(o)}:2:0.05:{STEPS}:{model}:config:-1:"
                f"inf:engine:-:{bucket}"
                for s, o in PLACEMENTS for prec in ("fp32", "bf16") for model, bucket in (("reuse", 0), ("reuse32", 64))},
             **{(s, o, "fp32", "swapped"): f"odd{s}{int(o)}swapped:{s}:fp32:{int(o)}:2:0.05:{STEPS}:swapped:config:-1:"
                "inf:engine:-:64" for s, o in PLACEMENTS},
             **{(s, o, "fp32", "twice"): f"odd{s}{int(o)}twice:{s}:fp32:{int(o)}:2:0.05:{STEPS}:plain:config:-1:"
                "inf:twice" for s, o in PLACEMENTS}}


@pytest.fixture(scope="module")
def distinct(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix_distinct") / "out.pt"
    launch(os.path.join(HERE, "worker_zero.py"), [out, *DISTINCT.values()], nprocs=2, timeout=600,
           extra_env={"DSFAST_TEST_PLACEMENT": "distinct-host"})
    return torch.load(out)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix") / "out.pt"
    texts = list(MATRIX.values()) + list(SKIP.values()) + list(HUGE.values()) + list(PLAIN.values()) + list(COMM32.values()) + list(ODD_GRADS.values())
    launch(os.path.join(HERE, "worker_zero.py"), [out, *texts], nprocs=2, timeout=600)
    return torch.load(out)


@functools.lru_cache(maxsize=None)
def reference(optimizer, precision):
    """One process at stage 0, GAS 4: the same global batches as 2 ranks x GAS 2."""
    import dsfast
    spec = parse(_text(0, False, optimizer, precision))
    spec.update(gas=4)
    losses, engine = train(dsfast.initialize, spec, 0, 1, dist_init_required=False)
    return losses, full_params(engine)


def reference_of(text, stage=0, offload=False):
    """`text` trained in one process at `stage` (default: stage 0 without offload) on the same global batches."""
    import dsfast
    spec = parse(text)
    spec.update(gas=4, stage=stage, offload=offload, backward="engine")
    losses, engine = train(dsfast.initialize, spec, 0, 1, dist_init_required=False)
    return losses, full_params(engine)


_odd_reference = functools.lru_cache(maxsize=None)(
    lambda precision, model: reference_of(ODD_GRADS[(0, False, precision, model)]))


def _distance(ranks_, want):
    got = torch.cat([ranks_[0]["params"][n].flatten() for n in want])
    ref = torch.cat([want[n].flatten() for n in want])
    return float((got - ref).norm() / ref.norm())


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("stage,offload", PLACEMENTS)
def test_two_ranks_equal_one_process_at_stage0(ranks, stage, offload, optimizer, precision):
    _assert_equals_one_process(ranks[MATRIX[(stage, offload, optimizer, precision)]], *reference(optimizer, precision),
                               precision)


def _assert_equals_one_process(got, want_losses, want, precision):
    """fp32: within float32 rounding of another summation order; 16-bit: identical on every rank and within the
    precision's relative distance of the reference."""
    assert all(r["skipped"] == 0 for r in got)
    if precision == "fp32":
        mean_losses, ref_losses = compare_to_reference(got, want, want_losses, atol=1e-5, rtol=1e-5)
        assert mean_losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
        return
    for r in got[1:]:
        for n in want:
            assert torch.equal(r["params"][n], got[0]["params"][n]), n
    assert _distance(got, want) < (2e-2 if precision == "bf16" else 5e-3)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_stage_reduces_through_the_one_reducer(ranks, stage):
    # same-host CPU ranks: fp32 gradients go through the /dev/shm table at every stage, 16-bit ones through gloo's
    # collectives (the table holds fp32 only); bucket after bucket during backward, so at least one reduction per
    # reducing backward of the run (stages 0-1 reduce at the boundary only, 2-3 at every micro-step)
    for precision, transport in (("fp32", "shm"), ("bf16", "shm" if stage == 0 else "gloo")):
        for r in ranks[MATRIX[(stage, False, "config", precision)]]:
            module, used, launched = r["reduction"]
            assert module == "dsfast.zero.grads.reducer" and used == transport, (precision, r["reduction"])
            assert launched >= STEPS * (1 if stage < 2 else 2)


def test_the_optimizers_really_differ(ranks):
    # The matrix would not notice a wrong rule if every optimizer landed on the same weights. torch.optim.Adam and
    # FusedAdam(adam_w_mode=False) are one rule (Adam with L2 decay, both with the client LR schedule) through two
    # paths (the generic contract, the fused kernel) and must agree; the rest must differ from each other.
    final = {opt: torch.cat([v.flatten() for v in reference(opt, "fp32")[1].values()]) for opt in OPTIMIZERS}
    torch.testing.assert_close(final["fused_adam"], final["torch_adam"], atol=1e-6, rtol=1e-5)
    for a, b in (("adam", "config"), ("adam", "nesterov"), ("config", "nesterov"), ("adam", "torch_adam")):
        assert (final[a] - final[b]).abs().max() > 1e-4, (a, b)


@pytest.mark.parametrize("stage", range(4))
def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank_at_every_stage(ranks, stage):
    got = ranks[SKIP[stage]]
    assert [r["skipped"] for r in got] == [1, 1]
    for n in got[0]["params"]:
        assert torch.equal(got[1]["params"][n], got[0]["params"][n])
        torch.testing.assert_close(got[0]["params"][n], ranks[SKIP[0]][0]["params"][n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("stage", range(4))
def test_bf16_huge_finite_gradient_is_applied_alike_at_every_stage(ranks, stage):
    got = ranks[HUGE[stage]]
    assert [r["skipped"] for r in got] == [0, 0]
    stage0 = ranks[HUGE[0]][0]
    for n in got[0]["params"]:
        assert torch.isfinite(got[0]["params"][n]).all()
        assert torch.equal(got[1]["params"][n], got[0]["params"][n])
    # bf16 gradients reduced in bf16 at ZeRO stages (fp32 at stage 0): within bf16 rounding of stage 0's result
    assert _distance(got, stage0["params"]) < 2e-2


@pytest.mark.parametrize("key", sorted(DISTINCT))
def test_offload_copies_between_distinct_buffers_change_no_bit(ranks, distinct, key):
    got, want = distinct[DISTINCT[key]], ranks[DISTINCT[key]]
    for g, w in zip(got, want):
        assert g["losses"] == w["losses"]
        for n in w["params"]:
            assert torch.equal(g["params"][n], w["params"][n]), n
        assert sum(g["memory"]["comm_buffers"].values()) > 0   # the host copies existed


@pytest.mark.parametrize("stage,precision", sorted(PLAIN))
def test_plain_loss_backward_trains_as_engine_backward(ranks, stage, precision):
    got, want = ranks[PLAIN[(stage, precision)]], ranks[MATRIX[(stage, False, "config", precision)]]
    tol = 1e-6 if precision == "fp32" else 1e-2   # the 1/GAS is applied to the output's gradient, not the loss
    for g, w in zip(got, want):
        assert g["skipped"] == w["skipped"] == 0
        for n in w["params"]:
            torch.testing.assert_close(g["params"][n], w["params"][n], atol=tol, rtol=tol)


@pytest.mark.parametrize("stage,offload", sorted(COMM32))
def test_bf16_reduced_in_fp32_is_much_closer_to_stage0(ranks, stage, offload):
    # communication_data_type fp32: the reduce-scatters (gloo or /dev/shm) and the accumulation run in fp32, as
    # stage 0's buckets do; only the summation order (and the bf16 forward it feeds) differs from the reference
    got = ranks[COMM32[(stage, offload)]]
    _, want = reference("config", "bf16")
    for r in got[1:]:
        for n in want:
            assert torch.equal(r["params"][n], got[0]["params"][n]), n
    bf16_reduced = _distance(ranks[MATRIX[(stage, offload, "config", "bf16")]], want)
    assert _distance(got, want) < min(1e-3, bf16_reduced / 2), (_distance(got, want), bf16_reduced)


@pytest.mark.parametrize("stage,offload,precision,model", sorted(ODD_GRADS))
def test_gradients_out_of_bucket_order_train_as_one_process(ranks, stage, offload, precision, model):
    _assert_equals_one_process(ranks[ODD_GRADS[(stage, offload, precision, model)]], *_odd_reference(precision, model),
                               precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage,offload", PLACEMENTS[1:])
def test_reused_layer_trains_alike_at_every_stage_on_one_rank(stage, offload, precision, model="reuse32"):
    # (one bucket per tensor: the checkpoint's gradient comes after its bucket was reduced at stages 2-3; stages
    # 0-1 reduce nothing on one rank)
    want_losses, want = _odd_reference(precision, model)
    losses, got = reference_of(ODD_GRADS[(stage, offload, precision, model)], stage, offload)
    if precision == "fp32":
        assert losses == pytest.approx(want_losses, rel=1e-5, abs=1e-6)
        for n in want:
            torch.testing.assert_close(got[n], want[n], atol=1e-5, rtol=1e-5, msg=n)
        return
    assert _distance([{"params": got}], want) < 2e-2


@pytest.mark.parametrize("model", ["reuse", "reuse32"])
def test_reused_layer_reference_is_plain_torch(model):
    """The one-process reference of the reused layer equals plain PyTorch (AdamW, clip_grad_norm_) on the global
    batch, the checkpoint's two gradients summed by autograd."""
    from dp_common import MICRO, global_batch
    from zero_common import MODELS
    _, want = _odd_reference("fp32", model)
    net = MODELS[model]()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(STEPS):
        x, y = global_batch(step, MICRO * 4)
        opt.zero_grad()
        for i in range(4):   # the reference's micro-steps (GAS 4), each loss / 4
            sl = slice(i * MICRO, (i + 1) * MICRO)
            (torch.nn.functional.mse_loss(net(x[sl]), y[sl]) / 4).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05)
        opt.step()
    for n, p in net.named_parameters():
        torch.testing.assert_close(want[n], p.detach(), atol=1e-5, rtol=1e-5, msg=n)
