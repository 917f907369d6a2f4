"""16-bit masters and optimizer states (bf16_master_weights_and_grads, bf16_optimizer_states,
fp16_master_weights_and_grads) on 2 and 4 gloo ranks, under the test placement that keeps host and device memory
apart (so an offloaded run holds its host master copy, as on a GPU).

  - every stage 1-3, with and without offload, trains to the same parameters (bf16 rounding of different
    reduction orders: held to 1e-2 relative of each other) and within bf16 noise of the fp32-master bf16 run at
    stage 0 on the same global batches (2e-2, the equivalence matrix's bf16 bound); every rank holds the same;
  - the masters and moments are 16-bit tensors, and each rank's memory_breakdown() equals
    partition.model_state_bytes(master16=..., states16=...) to the padding.
"""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch_runs  # noqa: E402
from zero_common import full_params, parse, train  # noqa: E402

STEPS = 4


def _text(stage, offload, precision):
    return f"lp{stage}{int(offload)}{precision}:{stage}:{precision}:{int(offload)}:2:0.05:{STEPS}:plain:config:-1"


RUNS2 = {(s, o, p): _text(s, o, p) for s, o, p in [(1, False, "bf16m"), (1, True, "bf16m"), (2, False, "bf16m"),
                                                   (2, True, "bf16m"), (3, False, "bf16m"), (3, True, "bf16m"),
                                                   (2, True, "bf16mo"), (3, True, "fp16mo")]}
RUNS4 = {(s, o, p): _text(s, o, p) for s, o, p in [(2, False, "bf16m"), (3, True, "bf16m"), (1, True, "bf16mo")]}


def _launch(tmp_path_factory, runs, nprocs):
    return launch_runs(tmp_path_factory, os.path.join(HERE, "worker_zero.py"), runs, nprocs, timeout=600,
                       extra_env={"DSFAST_TEST_PLACEMENT": "distinct-host"})


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return _launch(tmp_path_factory, RUNS2, 2)


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return _launch(tmp_path_factory, RUNS4, 4)


def _reference(world, precision):
    """fp32 masters at stage 0 in one process, the same global batches (GAS 2 x world)."""
    import dsfast
    spec = parse(_text(0, False, precision[:4]))
    spec.update(gas=spec["gas"] * world)
    losses, engine = train(dsfast.initialize, spec, 0, 1, dist_init_required=False)
    return losses, full_params(engine)


def _distance(a, b):
    x = torch.cat([a[n].flatten() for n in sorted(a)])
    y = torch.cat([b[n].flatten() for n in sorted(a)])
    return float((x - y).norm() / y.norm())


@pytest.mark.parametrize("runs,world", [("two", 2), ("four", 4)])
def test_every_stage_and_offload_trains_alike_and_near_fp32_masters(request, runs, world):
    results = request.getfixturevalue(runs)
    for precision in ("bf16", "fp16"):
        keys = [k for k in results if k[2].startswith(precision)]
        if not keys:
            continue
        want_losses, want = _reference(world, precision)
        first = results[keys[0]][0]["params"]
        for key in keys:
            ranks = results[key]
            for r in ranks[1:]:   # every rank assembles the same parameters
                assert all(torch.equal(r["params"][n], ranks[0]["params"][n]) for n in want), key
            assert _distance(ranks[0]["params"], first) < 1e-2, key
            assert _distance(ranks[0]["params"], want) < 2e-2, (key, _distance(ranks[0]["params"], want))
            losses = [sum(r["losses"][i] for r in ranks) / world for i in range(STEPS)]
            assert losses == pytest.approx(want_losses, rel=5e-2, abs=1e-3), key


def _formula(psi, world, stage, offload, precision):
    from dsfast.zero import model_state_bytes
    b = model_state_bytes(psi, world, stage, True, offload, master16=True, states16=precision == "bf16m")
    return b["device"] + b["host"]


@pytest.mark.parametrize("runs,world", [("two", 2), ("four", 4)])
def test_memory_breakdown_is_the_16bit_master_formula(request, runs, world):
    for (stage, offload, precision), ranks in request.getfixturevalue(runs).items():
        r = ranks[0]
        mem = r["memory"]
        measured = sum(v for cat, per in mem.items() if cat not in ("total", "comm_buffers", "gathered")
                       for v in per.values())
        psi = r["numel"]
        # padding: stages 1-2 one bucket, stage 3 one per parameter, each < world x 16 elements
        pad = world * 16 * (len(r["params"]) if stage == 3 else 1)
        low = _formula(psi, world, stage, offload, precision)
        high = _formula(psi + pad, world, stage, offload, precision)
        assert low <= measured <= high, ((stage, offload, precision), mem, low, high)
        states = sum(mem["optimizer_states"].values())
        moment_bytes = 2 if precision == "bf16m" else 4
        assert 2 * moment_bytes * psi / world <= states <= 2 * moment_bytes * (psi + pad) / world, mem
