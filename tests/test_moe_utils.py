"""deepspeed.moe (dsfast.moe): the optimizer-group helpers return dense groups as DeepSpeed does; MoE layers and
expert parameters are refused with a clear error; importing never fails."""
import pytest
import torch

import dsfast
from dsfast.moe.layer import MoE, MoEUnsupportedError
from dsfast.moe.utils import (configure_moe_param_groups, has_moe_layers, is_moe_param, is_moe_param_group,
                              split_params_grads_into_shared_and_expert_params,
                              split_params_into_different_moe_groups_for_optimizer,
                              split_params_into_shared_and_expert_params)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def _ids(groups):
    return [[id(p) for p in g["params"]] for g in groups]


def test_dense_dict_becomes_a_one_group_list_with_everything_else_kept():
    m = model()
    group = {"params": m.parameters(), "name": "dense", "lr": 0.1, "weight_decay": 0.0}
    out = split_params_into_different_moe_groups_for_optimizer(group)
    assert isinstance(out, list) and len(out) == 1 and out[0] is group
    assert _ids(out) == [[id(p) for p in m.parameters()]]
    assert {k: v for k, v in out[0].items() if k != "params"} == {"name": "dense", "lr": 0.1, "weight_decay": 0.0}
    torch.optim.SGD(out, lr=0.1)   # the result is what an optimizer accepts


def test_list_and_tuple_of_groups_and_max_group_size():
    m = model()
    decay = [p for n, p in m.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in m.named_parameters() if n.endswith("bias")]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    out = split_params_into_different_moe_groups_for_optimizer(groups, max_group_size=1)
    assert out is groups and _ids(out) == [[id(p) for p in decay], [id(p) for p in no_decay]]
    out = split_params_into_different_moe_groups_for_optimizer(tuple(groups))
    assert isinstance(out, list) and _ids(out) == [[id(p) for p in decay], [id(p) for p in no_decay]]
    assert split_params_into_different_moe_groups_for_optimizer(groups, max_group_size=None) is groups


@pytest.mark.parametrize("bad, match", [(torch.nn.Linear(2, 2).weight, "must be a dict, a list or a tuple"),
                                        ([torch.nn.Linear(2, 2).weight], r"param_groups\[0\] must be a dict"),
                                        ([{"lr": 0.1}], r"param_groups\[0\].*keys \['lr'\]")])
def test_bad_param_groups_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        split_params_into_different_moe_groups_for_optimizer(bad)


@pytest.mark.parametrize("size", [0, -3, True, "10"])
def test_bad_max_group_size(size):
    with pytest.raises(ValueError, match="max_group_size"):
        split_params_into_different_moe_groups_for_optimizer({"params": model().parameters()}, max_group_size=size)


def test_expert_parameters_are_refused_with_their_position_and_group():
    m = model()
    expert = m[2].weight
    expert.allreduce = False
    expert.group_name = "ep_size_2"
    assert is_moe_param(expert) and not is_moe_param(m[0].weight)
    groups = [{"params": [m[0].weight]}, {"params": [m[0].bias, expert]}]
    with pytest.raises(MoEUnsupportedError) as info:
        split_params_into_different_moe_groups_for_optimizer(groups)
    msg = str(info.value)
    assert "param_groups[1]['params'][1]" in msg and "ep_size_2" in msg and "allreduce=False" in msg
    with pytest.raises(MoEUnsupportedError):
        configure_moe_param_groups(list(m.parameters()))
    with pytest.raises(MoEUnsupportedError):
        configure_moe_param_groups([{"params": [expert], "moe": True}])
    # allreduce=True is an ordinary parameter (DeepSpeed's rule)
    expert.allreduce = True
    assert split_params_into_different_moe_groups_for_optimizer({"params": [expert]})[0]["params"] == [expert]


def test_shared_and_expert_splits():
    m = model()
    m[2].bias.allreduce = False
    shared, expert = split_params_into_shared_and_expert_params(list(m.parameters()))
    assert expert == [m[2].bias] and len(shared) == 3
    m(torch.ones(1, 4)).sum().backward()
    sg, eg = split_params_grads_into_shared_and_expert_params(list(m.parameters()))
    assert len(sg) == 3 and len(eg) == 1 and torch.equal(eg[0], m[2].bias.grad)


def test_configure_moe_param_groups_on_dense_models():
    m = model()
    out = configure_moe_param_groups(list(m.parameters()))
    assert len(out) == 1 and out[0]["name"] == "dense-params" and len(out[0]["params"]) == 4
    groups = [{"params": list(m.parameters())}]
    assert configure_moe_param_groups(groups) is groups
    assert not is_moe_param_group(groups[0]) and is_moe_param_group({"moe": True})
    with pytest.raises(TypeError, match="must be a list"):
        configure_moe_param_groups(m.parameters())
    with pytest.raises(TypeError, match="iterable of Tensors or dicts"):
        configure_moe_param_groups([1.0])


def test_moe_layer_imports_but_is_refused_when_built():
    assert has_moe_layers(model()) == (False, 0)
    with pytest.raises(MoEUnsupportedError, match="num_experts=8.*dense models only"):
        MoE(hidden_size=16, expert=torch.nn.Linear(16, 16), num_experts=8)
    assert issubclass(MoEUnsupportedError, NotImplementedError)
    import dsfast.moe.utils as utils
    assert dsfast.moe.utils is utils


def test_same_result_as_deepspeed_on_a_dense_model():
    """Optional (runs where deepspeed imports, e.g. /work/venv-ds with DS_ACCELERATOR=cpu). Lists only: given a
    generator, DeepSpeed 0.19 consumes it in a first pass and returns the group empty; dsfast keeps its params."""
    ds_utils = pytest.importorskip("deepspeed.moe.utils")
    m = model()
    make = lambda: [{"params": [p for n, p in m.named_parameters() if "weight" in n], "name": "w", "lr": 1.0},
                    {"params": [p for n, p in m.named_parameters() if "bias" in n], "name": "b"}]
    theirs = ds_utils.split_params_into_different_moe_groups_for_optimizer(make())
    ours = split_params_into_different_moe_groups_for_optimizer(make())
    assert _ids(ours) == _ids(theirs)
    assert [{k: v for k, v in g.items() if k != "params"} for g in ours] == \
        [{k: v for k, v in g.items() if k != "params"} for g in theirs]
