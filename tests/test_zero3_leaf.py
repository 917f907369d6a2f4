"""DeepSpeed's ZeRO stage 3 leaf modules in one process: deepspeed.utils.set_z3_leaf_modules / unset / get and
friends (classes, class names, subclasses, names, suffixes, bad input) and zero_optimization.leaf_module, against
DeepSpeed 0.19.8's behaviour (its z3_leaf_module.py and leaf_module_config.py, read); at stage 3 a leaf gathers its
whole subtree before its forward and nothing inside it is hooked. The multi-rank MoE case:
tests/distributed/test_zero3_leaf_dp.py."""
import logging

import pytest
import torch

import dsfast
from dsfast.config import DsConfig
from dsfast.utils import (get_z3_leaf_modules, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
                          set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter)
from dsfast.utils.z3_leaf_module import DEFAULT_LEAF_MODULE_CLASSES, LeafModuleClassError


class Base(torch.nn.Module):
    pass


class Block(Base):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.seen = []

    def forward(self, x):
        # what a leaf's forward finds: every parameter of its subtree whole, whichever child runs
        self.seen.append([p.numel() for p in self.parameters()])
        return self.a(x) if x.sum() > 0 else self.b(x)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(4, 4)
        self.block = Block()
        self.out = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.out(self.block(self.inp(x)))


def test_set_get_unset_by_class_class_name_qualified_name_and_subclass():
    model = Net()
    assert [m for m in set_z3_leaf_modules(model, [Block])] == [model.block]
    assert z3_leaf_module(model.block) and not z3_leaf_module(model) and get_z3_leaf_modules(model) == [model.block]
    assert unset_z3_leaf_modules(model, [Block]) == [model.block] and get_z3_leaf_modules(model) == []
    assert set_z3_leaf_modules(model, ["Block"]) == [model.block]                        # a class's __name__
    unset_z3_leaf_modules(model, [f"{Block.__module__}.{Block.__qualname__}"])           # or module.QualName
    assert get_z3_leaf_modules(model) == []
    assert set_z3_leaf_modules(model, [Base]) == [model.block]                            # subclasses match
    assert set_z3_leaf_modules(model, [torch.nn.Linear]) == [model.inp, model.block.a, model.block.b, model.out]


def test_bad_classes_and_classes_not_in_the_model_are_errors_as_in_deepspeed():
    model = Net()
    with pytest.raises(AssertionError, match="list of classes or class names.*got 3 of type int"):
        set_z3_leaf_modules(model, [Block, 3])        # DeepSpeed asserts (AssertionError); also a TypeError
    with pytest.raises(LeafModuleClassError, match="got the single .*put it in a list"):
        set_z3_leaf_modules(model, Block)
    assert get_z3_leaf_modules(model) == []           # nothing flagged by a refused call
    with pytest.raises(ValueError, match=r"No modules of type \['Conv2d'\] found in the model.*Block, Linear"):
        set_z3_leaf_modules(model, [torch.nn.Conv2d])
    assert set_z3_leaf_modules(model, ["NoSuchClass"], raise_if_not_found=False) == []
    with pytest.raises(ValueError, match="int is not a torch.nn.Module class"):
        set_z3_leaf_modules(model, [int], raise_if_not_found=False)
    with pytest.raises(ValueError, match="No modules of type"):
        unset_z3_leaf_modules(model, [torch.nn.Conv2d])


def test_by_name_and_by_suffix():
    model = Net()
    assert set_z3_leaf_modules_by_name(model, ["block", "nope"], raise_if_not_found=False) == ([model.block], ["nope"])
    with pytest.raises(ValueError, match=r"No modules named \['nope'\]"):
        set_z3_leaf_modules_by_name(model, ["nope"])
    matched, missing = set_z3_leaf_modules_by_suffix(model, [".a", "zz"], flag=True, raise_if_not_found=False)
    assert matched == [model.block.a] and missing == ["zz"] and z3_leaf_module(model.block.a)
    with pytest.raises(ValueError, match=r"No modules matching suffixes \['zz'\]"):
        set_z3_leaf_modules_by_suffix(model, ["zz"])


def test_leaf_module_config_defaults_coercion_and_unknown_keys():
    z = DsConfig(**{"train_batch_size": 2, "zero_optimization": {"stage": 3}}).zero_optimization
    assert z.leaf_module.classes == DEFAULT_LEAF_MODULE_CLASSES and z.leaf_module.names == []
    assert DEFAULT_LEAF_MODULE_CLASSES[0] == "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock"
    z = DsConfig(**{"train_batch_size": 2, "zero_optimization": {"stage": 3, "leaf_module": {
        "classes": "my.Class", "names": ["a", "a"], "name_suffixes": "tail"}}}).zero_optimization
    assert (z.leaf_module.classes, z.leaf_module.names, z.leaf_module.name_suffixes) == (["my.Class"], ["a"], ["tail"])
    with pytest.raises(Exception, match="leaf_module.*clases"):
        DsConfig(**{"train_batch_size": 2, "zero_optimization": {"stage": 3, "leaf_module": {"clases": ["X"]}}})


def _cfg(stage=3, leaf_module=None):
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if leaf_module is not None:
        zero["leaf_module"] = leaf_module
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "steps_per_print": 1000,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}, "zero_optimization": zero}


def _data(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(2, 4, generator=g) * (1 if step % 2 else -1), torch.randn(2, 1, generator=g)


def _train(engine_or_model, steps=4):
    torch_opt = None if hasattr(engine_or_model, "backward") else torch.optim.Adam(engine_or_model.parameters(),
                                                                                      lr=1e-2)
    for step in range(steps):
        x, y = _data(step)
        loss = torch.nn.functional.mse_loss(engine_or_model(x), y)
        if torch_opt is None:
            engine_or_model.backward(loss)
            engine_or_model.step()
        else:
            torch_opt.zero_grad()
            loss.backward()
            for p in engine_or_model.parameters():   # the child that did not run: a zero gradient, as every
                if p.grad is None:                      # DeepSpeed engine steps it (torch's Adam would skip it)
                    p.grad = torch.zeros_like(p)
            torch_opt.step()


def test_a_leaf_gathers_its_whole_subtree_unhooked_inside_and_trains_as_torch(caplog):
    ref = Net()
    _train(ref)
    model = Net()
    with caplog.at_level(logging.WARNING, logger="dsfast.program"):
        engine = dsfast.initialize(model=model, config=_cfg(leaf_module={"names": ["block", "missing"]}),
                                   dist_init_required=False)[0]
    assert "leaf_module.names: ['missing'] match no module" in caplog.text
    assert get_z3_leaf_modules(model) == [model.block]
    assert {n for n, p in model.named_parameters() if z3_leaf_parameter(p)} == {
        "block.a.weight", "block.a.bias", "block.b.weight", "block.b.bias"}
    assert not model.block.a._forward_pre_hooks and model.block._forward_pre_hooks   # nothing inside is hooked
    _train(engine)
    assert model.block.seen == [[16, 4, 16, 4]] * 4     # both children whole, though one runs per step
    assert all(p.numel() == 0 for p in model.parameters())   # released again after
    with dsfast.zero.GatheredParameters(list(model.parameters())):
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=n)
    with pytest.raises(RuntimeError, match=r"unset_z3_leaf_modules on a Block after deepspeed.initialize.*before"):
        unset_z3_leaf_modules(model, [Block])
    assert set_z3_leaf_modules(model, [Block]) == [model.block]   # no change: allowed
    engine.destroy()


def test_the_default_classes_and_other_stages_flag_without_hooks():
    model = Net()
    dsfast.initialize(model=model, config=_cfg(stage=2, leaf_module={"classes": ["Block"]}),
                      dist_init_required=False)
    assert get_z3_leaf_modules(model) == [model.block]    # flagged at every stage, as DeepSpeed does
    model = Net()
    dsfast.initialize(model=model, config=_cfg(), dist_init_required=False)
    assert get_z3_leaf_modules(model) == []              # the default classes (HF MoE blocks) are not in it


def test_a_root_leaf_whose_inputs_need_no_gradient_trains():
    # DeepSpeed 0.19.8 raises here (its test_no_grad_input_error); dsfast reduces a leaf's gradients as they come
    ref = Net()
    _train(ref)
    model = Net()
    set_z3_leaf_modules(model, [Net])
    engine = dsfast.initialize(model=model, config=_cfg(), dist_init_required=False)[0]
    _train(engine)
    with dsfast.zero.GatheredParameters(list(model.parameters())):
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=n)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.gate(x)) * self.up(x))


class FineGrained(torch.nn.Module):
    """DeepSpeed's test model for stage3_module_granularity_threshold, small: granularities (elements of the
    subtree per module counted in it) MLP 48 // 4 = 12, fine 144 // 13 = 11, root 484 // 20 = 24 (the ModuleList
    counts its MLP's 4 modules, not itself)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.coarse1, self.coarse2 = torch.nn.Linear(4, 32), torch.nn.Linear(32, 4)
        self.fine = torch.nn.Sequential(MLP(), MLP(), MLP())
        self.fine.__class__ = type("FineGrainedBlock", (torch.nn.Sequential,), {})   # not a container by name
        self.mlps = torch.nn.ModuleList([MLP()])                                      # a container: never a leaf

    def forward(self, x):
        return self.mlps[0](self.fine(self.coarse2(self.coarse1(x)))).sum(-1, keepdim=True)


@pytest.mark.parametrize("threshold,leaves", [(23, ["fine", "mlps.0"]), (11, ["fine"]), (24, [""]), (10, [])])
def test_stage3_module_granularity_threshold_chooses_leaves_as_deepspeed(threshold, leaves, caplog):
    model = FineGrained()
    cfg = _cfg()
    cfg["zero_optimization"]["stage3_module_granularity_threshold"] = threshold
    with caplog.at_level(logging.WARNING, logger="dsfast.program"):
        engine = dsfast.initialize(model=model, config=cfg, dist_init_required=False)[0]
    assert [n for n, m in model.named_modules() if z3_leaf_module(m)] == leaves
    if not leaves:
        assert "makes no leaf module: the smallest granularity is 11 (FineGrainedBlock)" in caplog.text
    ref = FineGrained()
    _train(ref)
    _train(engine)
    with dsfast.zero.GatheredParameters(list(model.parameters())):
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=n)
