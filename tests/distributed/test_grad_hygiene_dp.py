"""Gradient hygiene on 2 gloo ranks: the GAN loop, two backwards per step (GAS 1 and 2), plain loss.backward()."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402
from dp_common import MICRO, build_model, global_batch  # noqa: E402
from gan_common import torch_gan  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("hygiene") / "out.pt"
    launch(os.path.join(HERE, "worker_grad_hygiene.py"), [out], nprocs=2, timeout=150)
    return torch.load(out)


def _double_reference(gas, world=2, steps=3, lr=1e-2):
    """Plain torch on the global batch: one backward of the two losses' sum (each a mean over the batch)."""
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    for step in range(steps):
        x, y = global_batch(step, MICRO * gas * world)
        opt.zero_grad()
        out = model(x)
        (torch.nn.functional.mse_loss(out[:, :4], y[:, :4]) + torch.nn.functional.mse_loss(out[:, 4:], y[:, 4:])
         ).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_gan_on_two_ranks_matches_torch_on_the_global_batch(ranks):
    _, want_g, want_d = torch_gan(6)
    for r in ranks:
        _, got_g, got_d = r["gan"]
        for a, b in zip(got_g + got_d, want_g + want_d):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("key,gas", [("double_fp32_gas1", 1), ("double_fp32_gas2", 2), ("double_fp32_gas2_s1", 2),
                                     ("double_fp32_gas2_s2", 2), ("double_fp32_gas2_s3", 2)])
def test_two_backwards_per_step_equal_one_backward_of_the_sum_fp32(ranks, key, gas):
    want = _double_reference(gas)   # at ZeRO stages 1, 2 and 3 too (key suffix _s<stage>)
    for r in ranks:
        for a, b in zip(r[key], want):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


def test_two_backwards_per_step_bf16(ranks):
    want = _double_reference(2)
    got = torch.cat([p.flatten() for p in ranks[0]["double_bf16_gas2"]])
    ref = torch.cat([p.flatten() for p in want])
    assert (got - ref).norm() / ref.norm() < 1e-2  # bf16 forward/backward, fp32 masters
    for a, b in zip(ranks[0]["double_bf16_gas2"], ranks[1]["double_bf16_gas2"]):
        assert torch.equal(a, b)


def test_plain_backward_then_step_is_refused_on_every_rank(ranks):
    for r in ranks:
        message, unchanged = r["plain"]
        assert "engine.backward(loss) instead of loss.backward()" in message
        assert unchanged


def test_gradients_edited_after_backward_reach_the_offloaded_step(ranks):
    # the edits (a gradient cleared, two zeroed in place) change the result; with and without offload alike
    plain, unedited = ranks[0]["edited_offload0"], ranks[0]["unedited"]
    assert max(float((a - b).abs().max()) for a, b in zip(plain, unedited)) > 1e-4
    for r in ranks:
        for a, b in zip(r["edited_offload1"], plain):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
