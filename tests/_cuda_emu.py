"""Test-only: builds csrc/cuda with g++ against cuemu (csrc/cuda/emu, the CPU emulation of the CUDA
execution model) and exposes the kernels with the `cuda_optim` op's Python signatures, on CPU
tensors, so tests/gpu's kernel tests run unchanged on the emulator (tests/test_cuda_emulator.py).

DSFAST_CUDA_EMU_LIB=<path of libdsfast_cuda_emu.so> uses a library built elsewhere (the
sanitizer run and the bug-injection script, tests/cuda_emu_inject_bugs.py)."""
import ctypes
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

from dsfast.ops.reference import portable_multi_tensor as ref

ROOT = Path(__file__).resolve().parents[1]
_DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
ORDERS = {"forward": 0, "reverse": 1, "random": 2}


def cuda_include():
    """The toolkit's include directory (cuda_fp16.h), or None."""
    cands = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands += [Path(nvcc).resolve().parent.parent, Path(nvcc).parent.parent]
    for c in cands:
        if c and (Path(c) / "include" / "cuda_fp16.h").exists():
            return Path(c) / "include"
    return None


def missing_tools():
    """Why the emulator cannot be built here, or None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"the emulator's context switch is x86-64 only (this is {platform.machine()})"
    for tool in ("cmake", "g++"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if cuda_include() is None:
        return "the CUDA toolkit's headers (cuda_fp16.h) were not found; set CUDA_HOME"
    return None


def build(build_dir, sources=None, sanitize=False, jobs=2, targets=("dsfast_cuda_emu", "dsfast_cuda_emu_selftest")):
    """Configure and build; returns the build directory's csrc/cuda/emu (holding the library and selftest)."""
    build_dir = Path(build_dir)
    env = dict(os.environ)
    inc = cuda_include()
    if inc is not None:
        env.setdefault("CUDA_HOME", str(inc.parent))
    cfg = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release", "-DDSFAST_CUDA=OFF",
           "-DDSFAST_CUDA_EMU=ON", f"-DDSFAST_CUDA_EMU_SANITIZE={'ON' if sanitize else 'OFF'}"]
    if sources is not None:
        cfg.append(f"-DDSFAST_CUDA_EMU_SOURCES={sources}")
    for cmd in (cfg, ["cmake", "--build", str(build_dir), "--target", *targets, "-j", str(jobs)]):
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-6000:]}")
    return build_dir / "csrc" / "cuda" / "emu"


def _ptrs(ts):
    return (ctypes.c_void_p * max(len(ts), 1))(*[t.data_ptr() for t in ts])


def _fptr(t):
    return None if t is None else ctypes.cast(ctypes.c_void_p(t.data_ptr()), ctypes.POINTER(ctypes.c_float))


def _one_dtype(op, name, ts):
    for i, t in enumerate(ts):
        if t.device.type != "cpu":
            raise RuntimeError(f"{op}: {name}[{i}] is on {t.device}; the emulator runs on CPU tensors")
        if t.dtype != ts[0].dtype:
            raise TypeError(f"{op}: {name}[{i}] has dtype {t.dtype}, {name}[0] has {ts[0].dtype}")
    return _DTYPE[ts[0].dtype] if ts else 0


def _scalar(t):
    if t is not None and (t.dtype != torch.float32 or t.numel() != 1 or t.device.type != "cpu"):
        raise RuntimeError("device scalars must be one-element float32 CPU tensors")
    return _fptr(t)


class EmulatedOp:
    """The `cuda_optim` op's functions (same arguments and results), run by the emulated kernels."""

    def __init__(self, lib_path):
        self.path = str(lib_path)
        self.lib = ctypes.CDLL(self.path)
        for name in ("dsfast_emu_adam", "dsfast_emu_sgd", "dsfast_emu_unscale_and_check", "dsfast_emu_l2_norm"):
            getattr(self.lib, name).restype = ctypes.c_char_p
        self.lib.dsfast_emu_set_order.argtypes = [ctypes.c_int, ctypes.c_uint64]
        self.lib.dsfast_emu_launch_sizes.restype = ctypes.c_char_p

    def launch_sizes(self):
        """{kernel as the launch spelled it: the most threads per block it was launched with} so far."""
        out = {}
        for line in self.lib.dsfast_emu_launch_sizes().decode().splitlines():
            name, threads = line.rsplit(" ", 1)
            out[name] = int(threads)
        return out

    def set_order(self, order="forward", seed=0, workers=0):
        self.lib.dsfast_emu_set_order(ORDERS[order], seed)
        self.lib.dsfast_emu_set_workers(int(workers))

    @staticmethod
    def _check(err):
        if err is not None:
            raise RuntimeError(err.decode())

    @staticmethod
    def _numel(ts):
        return (ctypes.c_int64 * max(len(ts), 1))(*[t.numel() for t in ts])

    def adam_(self, grads, params, exp_avgs, exp_avg_sqs, steps, model_copies, lr, beta1, beta2, eps, weight_decay,
              adamw, bias_correction, inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
        op = "dsfast adam_"
        ref._check_lists("adam_", params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs,
                         model_copies=model_copies or None)
        if len(steps) != len(params):
            raise RuntimeError(f"{op}: got {len(steps)} steps for {len(params)} params")
        if not params:
            return
        gd, pd = _one_dtype(op, "grads", grads), _one_dtype(op, "params", params)
        _one_dtype(op, "exp_avgs", exp_avgs), _one_dtype(op, "exp_avg_sqs", exp_avg_sqs)
        md = _one_dtype(op, "model_copies", model_copies) if model_copies else 2
        for s in steps:
            _scalar(s)
        step_ptrs = (ctypes.POINTER(ctypes.c_float) * len(steps))(*[_fptr(s) for s in steps])
        self._check(self.lib.dsfast_emu_adam(
            ctypes.c_int64(len(params)), self._numel(params), _ptrs(grads), gd, _ptrs(params), pd, _ptrs(exp_avgs),
            _ptrs(exp_avg_sqs), step_ptrs, _ptrs(model_copies) if model_copies else None, md,
            ctypes.c_double(lr), ctypes.c_double(beta1), ctypes.c_double(beta2), ctypes.c_double(eps),
            ctypes.c_double(weight_decay), int(adamw), int(bias_correction), int(maximize), _scalar(inv_scale),
            _scalar(clip_coef), _scalar(found_inf)))

    def sgd_(self, grads, params, momentum_buffers, model_copies, lr, momentum, dampening, weight_decay, nesterov,
             first_step, inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
        op = "dsfast sgd_"
        if momentum == 0.0 and momentum_buffers:
            raise RuntimeError(f"{op}: momentum is 0 but momentum_buffers were given")
        ref._check_lists("sgd_", params, grads=grads, momentum_buffers=momentum_buffers if momentum != 0.0 else None,
                         model_copies=model_copies or None)
        if not params:
            return
        gd, pd = _one_dtype(op, "grads", grads), _one_dtype(op, "params", params)
        _one_dtype(op, "momentum_buffers", momentum_buffers)
        md = _one_dtype(op, "model_copies", model_copies) if model_copies else 2
        self._check(self.lib.dsfast_emu_sgd(
            ctypes.c_int64(len(params)), self._numel(params), _ptrs(grads), gd, _ptrs(params), pd,
            _ptrs(momentum_buffers) if momentum_buffers else None, _ptrs(model_copies) if model_copies else None, md,
            ctypes.c_double(lr), ctypes.c_double(momentum), ctypes.c_double(dampening),
            ctypes.c_double(weight_decay), int(nesterov), int(first_step), int(maximize), _scalar(inv_scale),
            _scalar(clip_coef), _scalar(found_inf)))

    def unscale_and_check_(self, grads, inv_scale, found_inf):
        if not grads:
            return
        d = _one_dtype("dsfast unscale_and_check_", "grads", grads)
        self._check(self.lib.dsfast_emu_unscale_and_check(
            ctypes.c_int64(len(grads)), self._numel(grads), _ptrs(grads), d, _scalar(inv_scale), _scalar(found_inf)))

    def l2_norm(self, tensors, per_tensor=False, inv_scale=None, found_inf=None, max_norm=0.0):
        if not tensors:
            raise RuntimeError("dsfast l2_norm: empty param list")
        d = _one_dtype("dsfast l2_norm", "tensors", tensors)
        for i, t in enumerate(tensors):
            if not t.is_contiguous():
                raise RuntimeError(f"dsfast l2_norm: tensors[{i}] is not contiguous")
        total = torch.empty(())
        per = torch.empty(len(tensors) if per_tensor else 0)
        clip = torch.empty(() if max_norm > 0.0 else (0,))
        self._check(self.lib.dsfast_emu_l2_norm(
            ctypes.c_int64(len(tensors)), self._numel(tensors), _ptrs(tensors), d, _fptr(total),
            _fptr(per) if per_tensor else None, _scalar(inv_scale), _scalar(found_inf),
            _fptr(clip) if max_norm > 0.0 else None, ctypes.c_float(max_norm)))
        return total, per, clip
