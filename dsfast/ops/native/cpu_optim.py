"""The native cpu_optim op (csrc/bindings/cpu_optim*.cpp) behind the reference's functions:
adam_step, sgd_step, adagrad_step, lion_step, available_isas, best_isa, openmp_enabled, same arguments
(dsfast.ops.reference.cpu_optim), and the fake implementations that let FakeTensor,
torch.compile and opcheck run through the mutating ops."""
import operator
import weakref
from itertools import repeat

import torch

from ..reference import cpu_optim as _ref
from ._errors import retyped

_adam = torch.ops.dsfast.cpu_adam_step.default
_sgd = torch.ops.dsfast.cpu_sgd_step.default
_adagrad = torch.ops.dsfast.cpu_adagrad_step.default
_lion = torch.ops.dsfast.cpu_lion_step.default
_adam_fill = torch.ops.dsfast.cpu_adam_table_fill_.default
_adam_table = torch.ops.dsfast.cpu_adam_table_.default
_sgd_fill = torch.ops.dsfast.cpu_sgd_table_fill_.default
_sgd_table = torch.ops.dsfast.cpu_sgd_table_.default
_one_fill = torch.ops.dsfast.cpu_one_state_table_fill_.default
_adagrad_table = torch.ops.dsfast.cpu_adagrad_table_.default
_lion_table = torch.ops.dsfast.cpu_lion_table_.default
_release = torch.ops.dsfast.cpu_table_release_.default
_adam8bit = torch.ops.dsfast.cpu_adam8bit_step.default
_adam8bit_fill = torch.ops.dsfast.cpu_adam8bit_table_fill_.default
_adam8bit_table = torch.ops.dsfast.cpu_adam8bit_table_.default
# Per row: param, grad, exp_avg, exp_avg_sq, out16, step addresses; numel; grad, out, param, state dtype codes;
# then a reference to each of those six tensors (0 where there is none).
ADAM_TABLE_COLUMNS, ADAM_HELD = 17, 11
# param, grad, momentum_buffer, out16 addresses; numel; grad, out, param, state dtype codes; references to the four.
SGD_TABLE_COLUMNS, SGD_HELD = 13, 9
# Adagrad / Lion: param, grad, state, out16, step addresses; numel; grad, out, param, state dtype codes; references.
ONE_STATE_TABLE_COLUMNS, ONE_STATE_HELD = 15, 10
# 8-bit Adam: param, grad, exp_avg codes / scales, exp_avg_sq codes / scales, out16, step addresses; numel; grad,
# out, param dtype codes; references to the eight.
ADAM8BIT_TABLE_COLUMNS, ADAM8BIT_HELD = 20, 12


def abi():
    """'stable' or 'classic': the torch ABI the loaded binary was built for."""
    return torch.ops.dsfast.cpu_optim_abi()


def available_isas():
    return torch.ops.dsfast.cpu_available_isas().split(",")


def best_isa():
    return available_isas()[0]


def openmp_enabled():
    return torch.ops.dsfast.cpu_openmp_enabled()


def _fill_missing_outs(params, outs):
    """The op takes [] or one 16-bit output per param; a None entry (no copy wanted for that
    param) gets a scratch tensor, so one call still checks everything before updating anything."""
    if not outs or not any(map(operator.is_, outs, repeat(None))):
        return outs
    if len(outs) != len(params):
        raise ValueError(f"outs has {len(outs)} entries; pass [] or one per param ({len(params)})")
    return [torch.empty(p.numel(), dtype=torch.bfloat16) if o is None and isinstance(p, torch.Tensor) else o
            for p, o in zip(params, outs)]


def adam_step(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw,
              bias_correction, grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    """Adam/AdamW over lists of CPU tensors (fp32, or 16-bit masters / states) in one parallel region; increments
    each step. round_seed nonzero: bf16 params are rounded stochastically (a new seed each call)."""
    outs = _fill_missing_outs(params, outs)
    try:
        _adam(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw,
              bias_correction, grad_scale, num_threads, isa, label, round_seed)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref.check_lists(("outs",), params=params, grads=grads, exp_avgs=exp_avgs,
                                                  exp_avg_sqs=exp_avg_sqs, outs=outs, steps=steps)) from None


def sgd_step(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, nesterov,
             grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    """SGD (momentum, dampening, nesterov, weight decay) over lists of CPU tensors (fp32, or 16-bit masters /
    states); round_seed as adam_step."""
    outs = _fill_missing_outs(params, outs)
    try:
        _sgd(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, nesterov,
             grad_scale, num_threads, isa, label, round_seed)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref.check_lists(("outs",), params=params, grads=grads,
                                                  momentum_buffers=momentum_buffers, outs=outs)) from None


def adagrad_step(params, grads, state_sums, outs, steps, lr, eps, weight_decay, grad_scale=1.0, num_threads=0,
                 isa="auto", label="params", round_seed=0):
    """Adagrad (torch.optim.Adagrad, lr_decay 0) over lists of CPU tensors in one parallel region; increments each
    step; outs and round_seed as adam_step."""
    outs = _fill_missing_outs(params, outs)
    try:
        _adagrad(params, grads, state_sums, outs, steps, lr, eps, weight_decay, grad_scale, num_threads, isa, label,
                 round_seed)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref.check_lists(("outs",), params=params, grads=grads, states=state_sums,
                                                  outs=outs, steps=steps)) from None


def lion_step(params, grads, exp_avgs, outs, steps, lr, beta1, beta2, weight_decay, grad_scale=1.0, num_threads=0,
              isa="auto", label="params", round_seed=0):
    """Lion (sign of the interpolated momentum, decoupled weight decay) over lists of CPU tensors in one parallel
    region; increments each step; outs and round_seed as adam_step."""
    outs = _fill_missing_outs(params, outs)
    try:
        _lion(params, grads, exp_avgs, outs, steps, lr, beta1, beta2, weight_decay, grad_scale, num_threads, isa,
              label, round_seed)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref.check_lists(("outs",), params=params, grads=grads, states=exp_avgs,
                                                  outs=outs, steps=steps)) from None


def adam8bit_step(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs, steps,
                  lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
                  grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    """Adam/AdamW with 8-bit block-wise moments (dsfast.ops.reference.adam8bit has the layout and the code formats) over
    lists of CPU tensors (fp32 or bf16 params) in one parallel region; increments each step."""
    outs = _fill_missing_outs(params, outs)
    try:
        _adam8bit(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs, steps,
                  lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
                  grad_scale, num_threads, isa, label, round_seed)
    except RuntimeError as e:
        raise retyped(e) from None


# Work tables (csrc/bindings/cpu_optim_table.h): one int64 row per param holding its tensors' addresses and
# a reference to each of them, filled after the list op's checks, so that a step passes one tensor
# instead of thousands. A table step first checks that every tensor still has its address and size
# (p.data = ... moves it) and, if one moved, writes nothing and raises a ValueError tagged _STALE, which
# the wrappers below turn into False: the caller then builds a new table (dsfast.optim._cpu_op.GroupCache).
_STALE = "[dsfast:stale-table]"
def _owning(table, held_from):
    """The table's references are given back when it is freed (not at exit: the process is going)."""
    weakref.finalize(table, _release, table[:, held_from:].clone()).atexit = False
    return table


def _table_ran(step_op, *args):
    """True if the table step ran, False if it found a moved tensor (and wrote nothing)."""
    try:
        step_op(*args)
    except ValueError as e:
        if str(e).startswith(_STALE):
            return False
        raise
    except RuntimeError as e:
        raise retyped(e) from None
    return True


def adam_table(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label="params"):
    """(table, outs): the work table of these lists, checked as adam_step checks them, and the 16-bit
    outputs it points at (None entries replaced by scratch tensors, which the table keeps alive)."""
    outs = _fill_missing_outs(params, outs)
    table = torch.empty((len(params), ADAM_TABLE_COLUMNS), dtype=torch.int64)
    try:
        _adam_fill(table, params, grads, exp_avgs, exp_avg_sqs, outs, steps, label)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref.check_lists(("outs",), params=params, grads=grads, exp_avgs=exp_avgs,
                                                  exp_avg_sqs=exp_avg_sqs, outs=outs, steps=steps)) from None
    return _owning(table, ADAM_HELD), outs


def adam_table_step(table, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale=1.0,
                    num_threads=0, isa="auto", round_seed=0):
    """adam_step over the tensors of a work table (adam_table), incrementing each step; False (and
    nothing written) if a tensor of the table has moved since it was filled."""
    return _table_ran(_adam_table, table, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale,
                      num_threads, isa, round_seed)


def adam8bit_table(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs, steps,
                   label="params"):
    """(table, outs) as adam_table, for adam8bit_table_step."""
    outs = _fill_missing_outs(params, outs)
    table = torch.empty((len(params), ADAM8BIT_TABLE_COLUMNS), dtype=torch.int64)
    try:
        _adam8bit_fill(table, params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                       steps, label)
    except RuntimeError as e:
        raise retyped(e) from None
    return _owning(table, ADAM8BIT_HELD), outs


def adam8bit_table_step(table, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale=1.0,
                        num_threads=0, isa="auto", round_seed=0):
    """adam8bit_step over the tensors of a work table (adam8bit_table), incrementing each step; False (and nothing
    written) if a tensor of the table has moved since it was filled."""
    return _table_ran(_adam8bit_table, table, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
                      grad_scale, num_threads, isa, round_seed)


def sgd_table(params, grads, momentum_buffers, outs, label="params"):
    """(table, outs) as adam_table, for sgd_table_step; momentum_buffers [] for momentum 0."""
    outs = _fill_missing_outs(params, outs)
    table = torch.empty((len(params), SGD_TABLE_COLUMNS), dtype=torch.int64)
    try:
        _sgd_fill(table, params, grads, momentum_buffers, outs, label)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref.check_lists(("outs",), params=params, grads=grads,
                                                  momentum_buffers=momentum_buffers, outs=outs)) from None
    return _owning(table, SGD_HELD), outs


def sgd_table_step(table, lr, momentum, dampening, weight_decay, nesterov, grad_scale=1.0, num_threads=0,
                   isa="auto", round_seed=0):
    """sgd_step over a work table (sgd_table) whose momentum buffers are already seeded; False (and
    nothing written) if a tensor of the table has moved."""
    return _table_ran(_sgd_table, table, lr, momentum, dampening, weight_decay, nesterov, grad_scale, num_threads,
                      isa, round_seed)


def one_state_table(params, grads, states, outs, steps, state_key="state", label="params"):
    """(table, outs) as adam_table, for adagrad_table_step / lion_table_step (states: Adagrad's sums or Lion's
    momenta; state_key names them in errors)."""
    outs = _fill_missing_outs(params, outs)
    table = torch.empty((len(params), ONE_STATE_TABLE_COLUMNS), dtype=torch.int64)
    try:
        _one_fill(table, params, grads, states, outs, steps, state_key, label)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref.check_lists(("outs",), params=params, grads=grads, states=states, outs=outs,
                                                  steps=steps)) from None
    return _owning(table, ONE_STATE_HELD), outs


def adagrad_table_step(table, lr, eps, weight_decay, grad_scale=1.0, num_threads=0, isa="auto", round_seed=0):
    """adagrad_step over a one_state_table, incrementing each step; False (and nothing written) if a tensor of the
    table has moved since it was filled."""
    return _table_ran(_adagrad_table, table, lr, eps, weight_decay, grad_scale, num_threads, isa, round_seed)


def lion_table_step(table, lr, beta1, beta2, weight_decay, grad_scale=1.0, num_threads=0, isa="auto", round_seed=0):
    """lion_step over a one_state_table, as adagrad_table_step."""
    return _table_ran(_lion_table, table, lr, beta1, beta2, weight_decay, grad_scale, num_threads, isa, round_seed)


def _check_table(table, columns, op, rows=None):
    if table.device.type != "cpu" or table.dtype != torch.int64 or table.dim() != 2 or table.shape[1] != columns \
            or not table.is_contiguous() or (rows is not None and table.shape[0] != rows):
        raise ValueError(f"{op}: the work table must be a contiguous int64 cpu tensor of shape "
                         f"[{'n' if rows is None else rows}, {columns}]")


# Fake (meta) implementations: the ops only mutate their inputs and return nothing, so a fake
# run only checks what the kernel would refuse (metadata alone: devices, dtypes, sizes). That
# also refuses real meta-device tensors, which dispatch here, with the kernel's message.
@torch.library.register_fake("dsfast::cpu_adam_step")
def _adam_fake(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw,
               bias_correction, grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    _ref.check_adam_args(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label)


@torch.library.register_fake("dsfast::cpu_sgd_step")
def _sgd_fake(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, nesterov,
              grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    _ref.check_sgd_args(params, grads, momentum_buffers, outs, first_steps, momentum, label)


@torch.library.register_fake("dsfast::cpu_adagrad_step")
def _adagrad_fake(params, grads, state_sums, outs, steps, lr, eps, weight_decay, grad_scale=1.0, num_threads=0,
                  isa="auto", label="params", round_seed=0):
    _ref.check_one_state_args(params, grads, state_sums, outs, steps, "state['exp_avg_sq']", label)


@torch.library.register_fake("dsfast::cpu_lion_step")
def _lion_fake(params, grads, exp_avgs, outs, steps, lr, beta1, beta2, weight_decay, grad_scale=1.0, num_threads=0,
               isa="auto", label="params", round_seed=0):
    _ref.check_one_state_args(params, grads, exp_avgs, outs, steps, "state['exp_avg']", label)


@torch.library.register_fake("dsfast::cpu_adam_table_fill_")
def _adam_fill_fake(table, params, grads, exp_avgs, exp_avg_sqs, outs, steps, label="params"):
    _check_table(table, ADAM_TABLE_COLUMNS, "cpu_adam_table_fill_", len(params))
    _ref.check_adam_args(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label)


@torch.library.register_fake("dsfast::cpu_adam_table_")
def _adam_table_fake(table, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale=1.0,
                     num_threads=0, isa="auto", round_seed=0):
    _check_table(table, ADAM_TABLE_COLUMNS, "cpu_adam_table_")


@torch.library.register_fake("dsfast::cpu_sgd_table_fill_")
def _sgd_fill_fake(table, params, grads, momentum_buffers, outs, label="params"):
    _check_table(table, SGD_TABLE_COLUMNS, "cpu_sgd_table_fill_", len(params))
    _ref.check_sgd_args(params, grads, momentum_buffers, outs, [False] * len(momentum_buffers),
                        1.0 if momentum_buffers else 0.0, label)


@torch.library.register_fake("dsfast::cpu_sgd_table_")
def _sgd_table_fake(table, lr, momentum, dampening, weight_decay, nesterov, grad_scale=1.0, num_threads=0,
                    isa="auto", round_seed=0):
    _check_table(table, SGD_TABLE_COLUMNS, "cpu_sgd_table_")


@torch.library.register_fake("dsfast::cpu_one_state_table_fill_")
def _one_fill_fake(table, params, grads, states, outs, steps, state_key="state", label="params"):
    _check_table(table, ONE_STATE_TABLE_COLUMNS, "cpu_one_state_table_fill_", len(params))
    _ref.check_one_state_args(params, grads, states, outs, steps, f"state[{state_key!r}]", label)


@torch.library.register_fake("dsfast::cpu_adagrad_table_")
def _adagrad_table_fake(table, lr, eps, weight_decay, grad_scale=1.0, num_threads=0, isa="auto", round_seed=0):
    _check_table(table, ONE_STATE_TABLE_COLUMNS, "cpu_adagrad_table_")


@torch.library.register_fake("dsfast::cpu_lion_table_")
def _lion_table_fake(table, lr, beta1, beta2, weight_decay, grad_scale=1.0, num_threads=0, isa="auto",
                     round_seed=0):
    _check_table(table, ONE_STATE_TABLE_COLUMNS, "cpu_lion_table_")


@torch.library.register_fake("dsfast::cpu_table_release_")
def _release_fake(held):
    if held.device.type != "cpu" or held.dtype != torch.int64:
        raise ValueError("cpu_table_release_: expects a contiguous int64 cpu tensor of held references")


@torch.library.register_fake("dsfast::cpu_adam8bit_step")
def _adam8bit_fake(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs, steps,
                   lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
                   grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    from ..reference.adam8bit import check_adam8bit_args
    check_adam8bit_args(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                        steps, label)


@torch.library.register_fake("dsfast::cpu_adam8bit_table_fill_")
def _adam8bit_fill_fake(table, params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales,
                        outs, steps, label="params"):
    from ..reference.adam8bit import check_adam8bit_args
    _check_table(table, ADAM8BIT_TABLE_COLUMNS, "cpu_adam8bit_table_fill_", len(params))
    check_adam8bit_args(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                        steps, label)


@torch.library.register_fake("dsfast::cpu_adam8bit_table_")
def _adam8bit_table_fake(table, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale=1.0,
                         num_threads=0, isa="auto", round_seed=0):
    _check_table(table, ADAM8BIT_TABLE_COLUMNS, "cpu_adam8bit_table_")
