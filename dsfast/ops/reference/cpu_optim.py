"""Pure-torch stand-in for the native `cpu_optim` op (Adam, SGD, Adagrad, Lion): the same functions and arguments
(csrc/bindings/cpu_optim*.cpp), the same math (csrc/include/dsfast/optim_math.h), one tensor at a time. Used when
the extension cannot be built; slower, never silently wrong. 16-bit params (masters) and states are computed in
fp32 and rounded to nearest even on the way back, as the kernels do.
"""
import math

import torch

_GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_ISAS = ("auto", "reference")


def available_isas():
    return ["reference"]


def best_isa():
    return "reference"


def openmp_enabled():
    return False


_M32 = 0xFFFFFFFF


def _mul32(x, c):
    """(x * c) mod 2^32 for int64 tensors of 32-bit values, without overflowing int64."""
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & _M32


def row_seed(seed, row):
    """csrc/bindings/cpu_optim_checks.h's row_seed: the call's seed made distinct per tensor (never 0)."""
    x = (seed & _M32) ^ ((seed >> 32) & _M32) ^ ((row * 0x85EBCA6B) & _M32)
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & _M32
    x ^= x >> 12
    return x or 1


def stochastic_bf16(x, seed):
    """half_convert.h's stochastic rounding of an fp32 tensor to bf16, bit for bit (murmur3's finaliser over the
    seed and each element's index gives the 16 bits added before truncating)."""
    h = _mul32(torch.arange(x.numel(), dtype=torch.int64) & _M32, 0x9E3779B1) ^ seed
    h ^= h >> 16
    h = _mul32(h, 0x85EBCA6B)
    h ^= h >> 13
    h = _mul32(h, 0xC2B2AE35)
    h ^= h >> 16
    b = x.reshape(-1).view(torch.int32).to(torch.int64) & _M32
    r = ((b + (h & 0xFFFF)) >> 16) & 0xFFFF
    r = torch.where(torch.isnan(x.reshape(-1)), (b >> 16) | 0x40, r)
    return (r - ((r >> 15) << 16)).to(torch.int16).view(torch.bfloat16).view(x.shape)


def _store(stored, value, seed, row):
    """The kernel's store of an updated param: nearest even, or stochastic rounding of a bf16 one (seed != 0)."""
    if value is stored:
        return
    if seed and stored.dtype == torch.bfloat16:
        stored.copy_(stochastic_bf16(value, row_seed(seed, row)))
    else:
        stored.copy_(value)


def check_isa(isa):
    if isa not in _ISAS:
        raise ValueError(f"isa={isa!r} needs the native cpu_optim op, which is not loaded (the pure-torch "
                         f"reference is in use); valid here: {', '.join(_ISAS)}")


def check_lists(allow_none=(), **seqs):
    for name, seq in seqs.items():
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"{name} must be a list or tuple of tensors")
        for i, t in enumerate(seq):
            if t is None and name in allow_none:
                continue
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}[{i}] is a {type(t).__name__}, not a tensor")


def _check_lengths(n, outs, **others):
    for name, seq in others.items():
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries but there are {n} params")
    if len(outs) not in (0, n):
        raise ValueError(f"outs has {len(outs)} entries; pass [] or one per param ({n})")


def _check_state(t, p, w, what):
    """An optimizer state: fp32, or the (16-bit) parameter's own dtype."""
    if t is None:
        raise ValueError(f"{w} {what} is missing")
    if t.device.type != "cpu":
        raise ValueError(f"{w} {what} is on {t.device}, not cpu")
    if t.dtype not in (torch.float32, p.dtype):
        raise TypeError(f"{w} {what} has dtype {t.dtype}; it must be float32 or the parameter's dtype ({p.dtype})")
    if not t.is_contiguous():
        raise ValueError(f"{w} {what} is not contiguous; updating a contiguous copy would lose the update")
    if t.numel() != p.numel():
        raise ValueError(f"{w} {what} has {t.numel()} elements but the parameter has {p.numel()}")


def _check_param(p, w):
    if p.device.type != "cpu":
        raise ValueError(f"{w} is on device {p.device}; CPU optimizers update cpu tensors only")
    if p.dtype not in _GRAD_DTYPES:
        raise TypeError(f"{w} has dtype {p.dtype}; CPU optimizers update float32, bfloat16 or float16 parameters")
    if not p.is_contiguous():
        raise ValueError(f"{w} is not contiguous; updating a contiguous copy would silently lose the update")


def _check_grad(g, p, w):
    if g is None:
        raise ValueError(f"{w}.grad is missing")
    if g.device.type != "cpu":
        raise ValueError(f"{w}.grad is on {g.device}, not cpu")
    if g.dtype not in _GRAD_DTYPES:
        raise TypeError(f"{w}.grad has dtype {g.dtype}; supported gradient dtypes are float32, bfloat16, float16")
    if g.shape != p.shape:
        raise ValueError(f"{w}.grad has shape {list(g.shape)} but the parameter has shape {list(p.shape)}")
    if not g.is_contiguous():
        raise ValueError(f"{w}.grad is not contiguous; the kernel reads gradients in place")


def _check_out(o, p, w):
    if o is None:
        return
    if o.device.type != "cpu":
        raise ValueError(f"{w} 16-bit output is on {o.device}")
    if o.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"{w} 16-bit output has dtype {o.dtype}; it must be bfloat16 or float16")
    if o.numel() != p.numel() or not o.is_contiguous():
        raise ValueError(f"{w} 16-bit output must be contiguous with {p.numel()} elements, got {o.numel()}")
    if p.dtype != torch.float32:
        raise ValueError(f"{w} has a 16-bit output but is itself {p.dtype}: a 16-bit master is its own 16-bit copy; "
                         "pass no output for it")


def _check_step(s, w):
    if not isinstance(s, torch.Tensor) or s.device.type != "cpu" or s.dtype != torch.float32 or s.numel() != 1:
        raise ValueError(f"{w} step must be a one-element float32 cpu tensor (torch's layout)")


def check_adam_args(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label="params"):
    """The native op's checks, on metadata only (so the op's fake implementation runs them too)."""
    check_lists(("outs",), params=params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs, outs=outs,
                 steps=steps)
    n = len(params)
    _check_lengths(n, outs, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs, steps=steps)
    for i, p in enumerate(params):   # validate everything before touching anything
        w = f"{label}[{i}]"
        _check_param(p, w)
        _check_grad(grads[i], p, w)
        _check_state(exp_avgs[i], p, w, "state['exp_avg']")
        _check_state(exp_avg_sqs[i], p, w, "state['exp_avg_sq']")
        if exp_avgs[i].dtype != exp_avg_sqs[i].dtype:
            raise TypeError(f"{w} state['exp_avg'] and state['exp_avg_sq'] have different dtypes")
        _check_out(outs[i] if outs else None, p, w)
        _check_step(steps[i], w)


def check_sgd_args(params, grads, momentum_buffers, outs, first_steps, momentum, label="params"):
    """As check_adam_args, for sgd_step."""
    check_lists(("outs",), params=params, grads=grads, momentum_buffers=momentum_buffers, outs=outs)
    n = len(params)
    _check_lengths(n, outs, grads=grads)
    if momentum != 0:
        _check_lengths(n, [], momentum_buffers=momentum_buffers, first_steps=first_steps)
    for i, p in enumerate(params):
        w = f"{label}[{i}]"
        _check_param(p, w)
        _check_grad(grads[i], p, w)
        if momentum != 0:
            _check_state(momentum_buffers[i], p, w, "state['momentum_buffer']")
        _check_out(outs[i] if outs else None, p, w)


def check_one_state_args(params, grads, states, outs, steps, state_name, label="params"):
    """As check_adam_args, for the one-state ops (adagrad_step: state['exp_avg_sq'], lion_step: state['exp_avg'])."""
    check_lists(("outs",), params=params, grads=grads, states=states, outs=outs, steps=steps)
    n = len(params)
    _check_lengths(n, outs, grads=grads, states=states, steps=steps)
    for i, p in enumerate(params):
        w = f"{label}[{i}]"
        _check_param(p, w)
        _check_grad(grads[i], p, w)
        _check_state(states[i], p, w, state_name)
        _check_out(outs[i] if outs else None, p, w)
        _check_step(steps[i], w)


def adam_step(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw,
              bias_correction, grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    check_adam_args(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label)
    check_isa(isa)
    with torch.no_grad():
        for i, stored in enumerate(params):
            p, m, v = stored.float(), exp_avgs[i].float(), exp_avg_sqs[i].float()   # copies only of 16-bit ones
            step = int(steps[i].item()) + 1
            bc1 = 1 - beta1 ** step if bias_correction else 1.0
            bc2 = 1 - beta2 ** step if bias_correction else 1.0
            g = grads[i].float()
            if grad_scale != 1.0:
                g = g * grad_scale
            if adamw:
                p.mul_(1 - lr * weight_decay)
            elif weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
            p.addcdiv_(m, denom, value=-lr / bc1)
            _store(stored, p, round_seed, i)
            for t, t32 in ((exp_avgs[i], m), (exp_avg_sqs[i], v)):
                if t is not t32:
                    t.copy_(t32)
            if outs and outs[i] is not None:
                outs[i].view(-1).copy_(p.view(-1))
            steps[i].add_(1)


def sgd_step(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, nesterov,
             grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    check_sgd_args(params, grads, momentum_buffers, outs, first_steps, momentum, label)
    check_isa(isa)
    with torch.no_grad():
        for i, stored in enumerate(params):
            p = stored.float()   # a copy only of a 16-bit master
            g = grads[i].float()
            if grad_scale != 1.0:
                g = g * grad_scale
            if weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            if momentum != 0:
                buf = momentum_buffers[i].float()
                if first_steps[i]:
                    buf.copy_(g)
                else:
                    buf.mul_(momentum).add_(g, alpha=1 - dampening)
                g = g.add(buf, alpha=momentum) if nesterov else buf
                if buf is not momentum_buffers[i]:
                    momentum_buffers[i].copy_(buf)
            p.add_(g, alpha=-lr)
            _store(stored, p, round_seed, i)
            if outs and outs[i] is not None:
                outs[i].view(-1).copy_(p.view(-1))


def _one_state_step(params, grads, states, outs, steps, grad_scale, round_seed, update):
    """The loop of adagrad_step / lion_step: update(p, g, state) on fp32 values (copies only of 16-bit tensors), then
    the stores the kernel makes."""
    with torch.no_grad():
        for i, stored in enumerate(params):
            p, s = stored.float(), states[i].float()
            g = grads[i].float()
            if grad_scale != 1.0:
                g = g * grad_scale
            update(p, g, s)
            _store(stored, p, round_seed, i)
            if s is not states[i]:
                states[i].copy_(s)
            if outs and outs[i] is not None:
                outs[i].view(-1).copy_(p.view(-1))
            steps[i].add_(1)


def adagrad_step(params, grads, state_sums, outs, steps, lr, eps, weight_decay, grad_scale=1.0, num_threads=0,
                 isa="auto", label="params", round_seed=0):
    check_one_state_args(params, grads, state_sums, outs, steps, "state['exp_avg_sq']", label)
    check_isa(isa)

    def update(p, g, s):
        if weight_decay != 0:
            g = g.add(p, alpha=weight_decay)
        s.addcmul_(g, g)
        p.addcdiv_(g, s.sqrt().add_(eps), value=-lr)

    _one_state_step(params, grads, state_sums, outs, steps, grad_scale, round_seed, update)


def lion_step(params, grads, exp_avgs, outs, steps, lr, beta1, beta2, weight_decay, grad_scale=1.0, num_threads=0,
              isa="auto", label="params", round_seed=0):
    check_one_state_args(params, grads, exp_avgs, outs, steps, "state['exp_avg']", label)
    check_isa(isa)

    def update(p, g, m):
        direction = (m * beta1).add_(g, alpha=1 - beta1).sign_()
        p.mul_(1 - lr * weight_decay).add_(direction, alpha=-lr)
        m.mul_(beta2).add_(g, alpha=1 - beta2)

    _one_state_step(params, grads, exp_avgs, outs, steps, grad_scale, round_seed, update)


from .adam8bit import adam8bit_step  # noqa: E402,F401  (the 8-bit-state Adam: same op, own file)
