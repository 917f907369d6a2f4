"""deepspeed.runtime.utils' clip_grad_norm_ / get_global_norm / get_weight_norm (dsfast/runtime/grad_norm.py),
single process: against torch.nn.utils.clip_grad_norm_ and torch.linalg.vector_norm, and bit for bit against
DeepSpeed 0.19.8's order of operations (fp32 per-parameter norms, their p-th powers summed, the 1/p root, then
min(1, max_norm / (norm + 1e-6)))."""
import math

import pytest
import torch

from dsfast.runtime import utils as ds_utils


def _params(seed, dtype=torch.float32, shapes=((7, 5), (5,), (3, 4, 2))):
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=g).to(dtype))
        p.grad = torch.randn(s, generator=g).to(dtype) * 3
        out.append(p)
    return out


def _deepspeed_order(grads, max_norm, p):
    """DeepSpeed 0.19.8's stage-0 arithmetic written out."""
    total = torch.stack([g.float().norm(p) for g in grads]).pow(p).sum().float().pow(1.0 / p)
    coef = torch.min(torch.tensor([1.0]), torch.tensor([float(max_norm)]) / (total + 1e-6))
    return total, [g * coef for g in grads]


@pytest.mark.parametrize("norm_type", [2, 1, 3.0])
def test_clip_matches_torch_and_deepspeed_order(norm_type):
    ours, ref = _params(0), _params(0)
    want_norm, want_grads = _deepspeed_order([p.grad.clone() for p in ours], 0.5, norm_type)
    norm = ds_utils.clip_grad_norm_(ours, max_norm=0.5, norm_type=norm_type)
    torch_norm = torch.nn.utils.clip_grad_norm_(ref, 0.5, norm_type=norm_type)
    assert torch.equal(norm, want_norm)
    for p, w in zip(ours, want_grads):
        assert torch.equal(p.grad, w)
    torch.testing.assert_close(norm, torch_norm, rtol=1e-6, atol=0)
    for p, r in zip(ours, ref):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-7)
    assert 0.49 < float(torch.cat([p.grad.flatten() for p in ours]).norm(norm_type)) <= 0.5


def test_clip_below_max_leaves_grads():
    ps = _params(1)
    before = [p.grad.clone() for p in ps]
    norm = ds_utils.clip_grad_norm_(ps, max_norm=1e6)
    torch.testing.assert_close(norm, torch.cat([b.flatten() for b in before]).norm(), rtol=1e-6, atol=0)
    for p, b in zip(ps, before):
        assert torch.equal(p.grad, b)


def test_clip_inf_norm_single_tensor_and_gradless_parameters():
    ps = _params(2)
    ps.append(torch.nn.Parameter(torch.ones(3)))           # no .grad: left out, as DeepSpeed does
    biggest = max(float(p.grad.abs().max()) for p in ps[:3])
    norm = ds_utils.clip_grad_norm_(ps, max_norm=1.0, norm_type=float("inf"))
    assert float(norm) == biggest
    assert max(float(p.grad.abs().max()) for p in ps[:3]) <= 1.0
    one = _params(3, shapes=((4,),))[0]
    assert float(ds_utils.clip_grad_norm_(one, 1e6)) == pytest.approx(float(one.grad.norm()), rel=1e-6)


def test_clip_bf16_grads_norm_in_fp32():
    ps = _params(4, dtype=torch.bfloat16)
    want_norm, want_grads = _deepspeed_order([p.grad.clone() for p in ps], 0.25, 2)
    norm = ds_utils.clip_grad_norm_(ps, 0.25)
    assert norm.dtype == torch.float32 and torch.equal(norm, want_norm)
    for p, w in zip(ps, want_grads):
        assert p.grad.dtype == torch.bfloat16 and torch.equal(p.grad, w.to(torch.bfloat16))


def test_clip_errors():
    with pytest.raises(ValueError, match="no parameter has a gradient"):
        ds_utils.clip_grad_norm_([torch.nn.Parameter(torch.ones(2))], 1.0)
    with pytest.raises(ValueError, match="norm_type must be positive"):
        ds_utils.clip_grad_norm_(_params(5), 1.0, norm_type=0)


def test_get_global_norm():
    assert ds_utils.get_global_norm([3.0, 4.0]) == 5.0
    assert ds_utils.get_global_norm([torch.tensor(3.0), 4.0]) == 5.0
    assert ds_utils.get_global_norm([]) == 0.0
    assert ds_utils.get_global_norm([1.0, float("nan")]) == float("inf")
    assert ds_utils.get_global_norm([1.0, torch.tensor(float("inf"))]) == float("inf")
    assert ds_utils.get_global_norm([1.0, -1.0]) == float("inf")      # a negative norm marks an overflow


def test_get_weight_norm():
    ps = _params(6)
    flat = torch.cat([p.detach().flatten() for p in ps])
    assert ds_utils.get_weight_norm(ps) == pytest.approx(float(flat.norm()), rel=1e-6)
    assert ds_utils.get_weight_norm(ps, norm_type=1) == pytest.approx(float(flat.norm(1)), rel=1e-6)
    assert ds_utils.get_weight_norm(ps, norm_type=math.inf) == float(flat.abs().max())
    assert isinstance(ds_utils.get_weight_norm(ps[0]), float)
    ps[1].ds_pipe_replicated = True                       # a pipeline copy: counted once, elsewhere
    rest = torch.cat([ps[0].detach().flatten(), ps[2].detach().flatten()])
    assert ds_utils.get_weight_norm(ps) == pytest.approx(float(rest.norm()), rel=1e-6)
    bad = torch.nn.Parameter(torch.tensor([1.0, float("inf")]))
    assert ds_utils.get_weight_norm([bad]) == -1
    assert ds_utils.get_weight_norm([bad], norm_type=math.inf) == -1
    with pytest.raises(ValueError, match="no parameters"):
        ds_utils.get_weight_norm([], norm_type=math.inf)


def test_model_parallel_rank_spellings():
    from dsfast.runtime.grad_norm import tensor_model_parallel_rank

    class New:
        def get_tensor_model_parallel_rank(self):
            return 3

    class Old:
        def get_model_parallel_rank(self):
            return 1

    assert tensor_model_parallel_rank(None) == 0
    assert tensor_model_parallel_rank(New()) == 3
    assert tensor_model_parallel_rank(Old()) == 1
    with pytest.raises(TypeError, match="get_tensor_model_parallel_rank"):
        tensor_model_parallel_rank(object())
    p = torch.nn.Parameter(torch.ones(1))
    assert not ds_utils.is_model_parallel_parameter(p)
    p.tensor_model_parallel = True
    assert ds_utils.is_model_parallel_parameter(p)
