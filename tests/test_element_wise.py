"""optim/element_wise.py: an optimizer declares that it is element-wise (so ZeRO may step it one unit at a time from
NVMe) and how many states per element its first step creates; torch's built-ins are declared by class; anything
else is refused for the NVMe walk, with the message it always had."""
import pytest
import torch

from dsfast.optim import CPUAdagrad, CPUAdam, CPUAdam8bit, CPUAdamW, CPULion, CPUSGD, FusedAdam, FusedSGD
from dsfast.optim.element_wise import element_wise_names, is_element_wise, states_per_element
from dsfast.zero.nvme.states import check_unit_by_unit


def _params():
    return [torch.nn.Parameter(torch.zeros(4))]


# (optimizer, states per element): what the removed class lists of zero/ said, kept exactly
KNOWN = [
    (lambda: CPUAdam(_params()), 2), (lambda: CPUAdamW(_params()), 2), (lambda: CPUAdam8bit(_params()), 0),
    (lambda: CPUSGD(_params()), 0), (lambda: CPUSGD(_params(), momentum=0.9), 1),
    (lambda: CPUAdagrad(_params()), 1), (lambda: CPULion(_params()), 1),
    (lambda: FusedAdam(_params()), 2), (lambda: FusedSGD(_params()), 0), (lambda: FusedSGD(_params(), momentum=0.9), 1),
    (lambda: torch.optim.Adam(_params()), 2), (lambda: torch.optim.AdamW(_params()), 2),
    (lambda: torch.optim.NAdam(_params()), 2), (lambda: torch.optim.RAdam(_params()), 2),
    (lambda: torch.optim.Adamax(_params()), 2), (lambda: torch.optim.Adagrad(_params()), 1),
    (lambda: torch.optim.SGD(_params(), lr=0.1), 0), (lambda: torch.optim.SGD(_params(), lr=0.1, momentum=0.9), 1),
    (lambda: torch.optim.RMSprop(_params()), 0),
]


@pytest.mark.parametrize("make,states", KNOWN)
def test_known_optimizers_are_element_wise_with_their_states(make, states):
    opt = make()
    assert is_element_wise(opt)
    check_unit_by_unit(opt)   # accepted
    assert states_per_element(opt) == states


def test_dsfast_optimizers_declare_it_on_the_class():
    for cls in (CPUAdam, CPUAdam8bit, CPUSGD, CPUAdagrad, CPULion, FusedAdam, FusedSGD):
        assert cls._dsfast_element_wise is True, cls
    assert CPUAdam._dsfast_states_per_element == 2 and CPULion._dsfast_states_per_element == 1


def test_a_client_optimizer_that_declares_it_is_accepted_and_budgeted():
    class Mine(torch.optim.Optimizer):
        _dsfast_element_wise = True
        _dsfast_states_per_element = 3

        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

    opt = Mine(_params())
    check_unit_by_unit(opt)
    assert states_per_element(opt) == 3


def test_a_declaration_overrides_the_torch_class_it_derives_from():
    class GlobalNormAdam(torch.optim.Adam):   # reads across parameters: says so
        _dsfast_element_wise = False

    with pytest.raises(ValueError, match=r'"nvme" steps the optimizer one unit .*GlobalNormAdam is not known'):
        check_unit_by_unit(GlobalNormAdam(_params()), "offload_param")


def test_an_undeclared_optimizer_is_refused_with_todays_message():
    opt = torch.optim.LBFGS(_params())
    assert not is_element_wise(opt) and states_per_element(opt) == 0
    with pytest.raises(ValueError) as e:
        check_unit_by_unit(opt)
    text = str(e.value)
    assert 'zero_optimization.offload_optimizer.device "nvme" steps the optimizer one unit' in text
    assert "torch.optim.lbfgs.LBFGS is not known to be one" in text
    for name in ("AdamW", "CPUAdam", "CPULion", "FusedSGD", "RMSprop"):
        assert name in text
    assert "_dsfast_element_wise = True" in text
    assert "LBFGS" not in element_wise_names()
    check_unit_by_unit(None)   # no optimizer (a load without one): nothing to check
