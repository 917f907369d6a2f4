"""dsfast.engine.autocast: the forward context for DeepSpeed's `torch_autocast` section, against torch.autocast
itself (same outputs and gradients), the outer-autocast rule, the GradScaler choice and lower_precision_safe_modules."""
import pytest
import torch

from dsfast.config import DsConfigError, load_config
from dsfast.engine.autocast import (COMM_DTYPE_ATTR, DEFAULT_LOWER_PRECISION_SAFE_MODULES, autocast_plan,
                                    resolve_module_classes)


def cfg(**section):
    return load_config({"train_batch_size": 2, "torch_autocast": section})


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def run(model, x, ctx):
    with ctx:
        out = model(x)
    loss = out.float().pow(2).mean()
    loss.backward()
    return out, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype, torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_enabled_plan_is_torch_autocast_with_fp32_weights_and_grads(dtype, torch_dtype):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    ours_model, ref_model = net(), net()
    factory = autocast_plan(cfg(enabled=True, dtype=dtype), "cpu").forward_context
    out, grads = run(ours_model, x, factory())
    ref_out, ref_grads = run(ref_model, x, torch.autocast("cpu", dtype=torch_dtype))
    assert out.dtype == torch_dtype and torch.equal(out, ref_out)
    for g, r, p in zip(grads, ref_grads, ours_model.parameters()):
        assert p.dtype == g.dtype == torch.float32 and torch.equal(g, r)
    # and it is not fp32 arithmetic: the result differs from a plain forward
    assert not torch.equal(out.float(), net()(x))


def test_dtype_unset_is_torchs_default_for_the_device():
    plan = autocast_plan(cfg(enabled=True), torch.device("cpu"))
    assert plan.enabled and plan.dtype == torch.get_autocast_dtype("cpu") and plan.device_type == "cpu"
    assert autocast_plan(cfg(enabled=True), "cuda:1").dtype == torch.get_autocast_dtype("cuda")


def test_config_dtype_wins_over_an_outer_autocast():
    factory = autocast_plan(cfg(enabled=True, dtype="bf16"), "cpu").forward_context
    with torch.autocast("cpu", dtype=torch.float16):
        with factory():
            assert net()(torch.ones(1, 8)).dtype == torch.bfloat16


def test_disabled_plan_switches_an_outer_autocast_off_as_deepspeed():
    factory = autocast_plan(cfg(), "cpu").forward_context
    with factory():
        assert not torch.is_autocast_enabled("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with factory():
            assert not torch.is_autocast_enabled("cpu")
            assert net()(torch.ones(1, 8)).dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")          # restored for the user's loss computation
    plan = autocast_plan(cfg(), "cpu")
    assert not plan.enabled and plan.grad_scaler() is None and plan.safe_module_classes == ()


def test_grad_scaler_only_for_float16():
    assert autocast_plan(cfg(enabled=True, dtype="bf16"), "cpu").grad_scaler() is None
    plan = autocast_plan(cfg(enabled=True, dtype="fp16"), "cpu")
    scaler = plan.grad_scaler()
    assert plan.needs_grad_scaler and isinstance(scaler, torch.amp.GradScaler)
    assert scaler.get_scale() == 2.0 ** 16          # torch's default, which DeepSpeed keeps


def test_default_safe_modules_are_deepspeeds_and_mark_exact_classes_only():
    plan = autocast_plan(cfg(enabled=True, dtype="bf16"), "cpu")
    assert plan.safe_module_classes == (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)

    class MyLinear(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2), torch.nn.Conv1d(1, 1, 1),
                                MyLinear(2, 2))
    marked = plan.mark_lower_precision_params(model)
    assert [id(p) for p in marked] == [id(p) for p in (*model[0].parameters(), *model[2].parameters())]
    assert all(getattr(p, COMM_DTYPE_ATTR) == torch.bfloat16 for p in marked)
    assert not any(hasattr(p, COMM_DTYPE_ATTR) for p in (*model[1].parameters(), *model[3].parameters()))


def test_named_safe_modules_resolve_by_any_module_path():
    plan = autocast_plan(cfg(enabled=True, lower_precision_safe_modules=["torch.nn.modules.linear.Linear",
                                                                         "torch.nn.LayerNorm"]), "cpu")
    assert plan.safe_module_classes == (torch.nn.Linear, torch.nn.LayerNorm)
    assert resolve_module_classes(DEFAULT_LOWER_PRECISION_SAFE_MODULES)[0] is torch.nn.Linear


@pytest.mark.parametrize("name, text", [("torch.nn.NoSuchLayer", "has no 'NoSuchLayer'"),
                                        ("nosuchpkg_xyz.Layer", "cannot be imported"),
                                        ("torch.nn.functional.relu", "is not a torch.nn.Module class")])
def test_unresolvable_safe_module_names_the_entry(name, text):
    with pytest.raises(DsConfigError) as info:
        autocast_plan(cfg(enabled=True, lower_precision_safe_modules=["torch.nn.Linear", name]), "cpu")
    assert f"torch_autocast.lower_precision_safe_modules[1]: {name!r}" in str(info.value) and text in str(info.value)


def test_default_list_matches_deepspeed():
    """Optional (runs where deepspeed imports, e.g. /work/venv-ds with DS_ACCELERATOR=cpu)."""
    ds = pytest.importorskip("deepspeed.runtime.torch_autocast")
    assert resolve_module_classes(ds.get_default_autocast_lower_precision_modules()) == \
        resolve_module_classes(DEFAULT_LOWER_PRECISION_SAFE_MODULES)
