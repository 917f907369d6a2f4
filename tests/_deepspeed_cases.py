"""The DeepSpeed cross-checks' inputs and how a run of them is traced, shared by the tests and by
tests/data/make_deepspeed_goldens.py, which records DeepSpeed's traces into tests/data/ so that the comparisons run
without DeepSpeed installed. Traces are plain JSON (floats round-trip exactly)."""
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
GOLDEN_DEEPSPEED = "0.19.8"      # the version the golden files were recorded from

# ------------------------------------------------------------------------------------------------ loss scaler
# 'O' overflow, '.' clean. The window is never reached: DeepSpeed 0.19 grows the scale one step later than its
# docs (and we) say, so only halving and hysteresis are compared.
LOSS_SCALE_PATTERN = "O.OO.O.OOO..O.O"
LOSS_SCALE_ARGS = dict(init_scale=2.0 ** 16, scale_window=10 ** 6, min_scale=1)
HYSTERESIS = 2      # ours: hysteresis=, DeepSpeed's: delayed_shift=


def loss_scale_trace(scaler):
    """[loss_scale, cur_hysteresis] after each step of LOSS_SCALE_PATTERN."""
    out = []
    for ch in LOSS_SCALE_PATTERN:
        scaler.update_scale(ch == "O")
        out.append([float(scaler.loss_scale), int(scaler.cur_hysteresis)])
    return out


# ------------------------------------------------------------------------------------------------ LR schedules
LR_CASES = [
    ("WarmupLR", dict(warmup_min_lr=0.001, warmup_max_lr=0.02, warmup_num_steps=7)),
    ("WarmupLR", dict(warmup_num_steps=5, warmup_type="linear")),
    ("WarmupDecayLR", dict(total_num_steps=25, warmup_num_steps=6, warmup_max_lr=0.05)),
    ("WarmupDecayLR", dict(total_num_steps=25, warmup_num_steps=6, warmup_type="linear")),
    ("WarmupCosineLR", dict(total_num_steps=25, warmup_num_steps=6, warmup_min_ratio=0.1, cos_min_ratio=0.05)),
    ("WarmupCosineLR", dict(total_num_steps=20, warmup_num_steps=3, warmup_type="linear")),
    ("OneCycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=5, cycle_second_step_size=3,
                      decay_lr_rate=0.3, decay_step_size=2, decay_mom_rate=0.1)),
    ("OneCycle", dict(cycle_min_lr=0.01, cycle_max_lr=0.1, cycle_first_step_size=6, cycle_first_stair_count=3)),
    ("LRRangeTest", dict(lr_range_test_min_lr=0.001, lr_range_test_step_size=3, lr_range_test_step_rate=0.5)),
    ("LRRangeTest", dict(lr_range_test_step_size=2, lr_range_test_staircase=True)),
]
LR_STEPS = 30


def lr_case_id(name, params):
    return name + "(" + ", ".join(f"{k}={v}" for k, v in sorted(params.items())) + ")"


def lr_optimizer():
    """AdamW with two groups at lr 0.03 (a schedule must drive every group)."""
    import torch
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(2)]
    return torch.optim.AdamW([{"params": [p]} for p in params], lr=0.03, betas=(0.9, 0.999))


def lr_trace(schedule, optimizer):
    """Each group's lr (and beta1, which OneCycle cycles) before each of LR_STEPS steps, then the state_dict."""
    steps = []
    for _ in range(LR_STEPS):
        steps.append({"lr": [g["lr"] for g in optimizer.param_groups],
                      "beta1": [g["betas"][0] for g in optimizer.param_groups]})
        schedule.step()
    return {"steps": steps, "state": schedule.state_dict()}


# ------------------------------------------------------------------------------------------------ config schema
# DeepSpeed's pydantic model (module, class) -> ours (module, class)
CONFIG_PAIRS = [
    (("deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"), ("dsfast.config.zero", "ZeroConfig")),
    (("deepspeed.runtime.zero.offload_config", "DeepSpeedZeroOffloadOptimizerConfig"),
     ("dsfast.config.zero", "OffloadOptimizerConfig")),
    (("deepspeed.runtime.zero.offload_config", "DeepSpeedZeroOffloadParamConfig"),
     ("dsfast.config.zero", "OffloadParamConfig")),
    (("deepspeed.runtime.precision_config", "DeepSpeedFP16Config"), ("dsfast.config.precision", "Fp16Config")),
    (("deepspeed.runtime.precision_config", "DeepSpeedBF16Config"), ("dsfast.config.precision", "Bf16Config")),
]


def model_class(module_and_name):
    import importlib
    module, name = module_and_name
    return getattr(importlib.import_module(module), name)


def config_fields(model):
    """{field: {"alias", "default"}} of a pydantic model, defaults as plain JSON values (enums by value)."""
    out = {}
    for name, field in model.model_fields.items():
        value = field.get_default(call_default_factory=True)
        value = getattr(value, "value", value)
        if hasattr(value, "model_dump"):
            value = value.model_dump()
        out[name] = {"alias": field.alias, "default": json.loads(json.dumps(value, default=str))}
    return out


# ------------------------------------------------------------------------------------------------ runtime defaults
# What a config resolves to where DeepSpeed's defaults changed in 0.19.x: the clip (1.0 since 0.19.3), offload
# pin_memory (true since 0.19.5), the process group's timeout (10 minutes, DEEPSPEED_TIMEOUT minutes).
RUNTIME_CONFIGS = {
    "omitted": {},
    "clip 0": {"gradient_clipping": 0.0},
    "clip 0.25": {"gradient_clipping": 0.25},
    "offload sections": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                               "offload_param": {"device": "cpu"}}},
    "offload sections unpinned": {"zero_optimization": {"stage": 3,
                                                        "offload_optimizer": {"device": "cpu", "pin_memory": False},
                                                        "offload_param": {"device": "cpu", "pin_memory": False}}},
    "deprecated cpu_offload": {"zero_optimization": {"stage": 2, "cpu_offload": True}},
}
TIMEOUT_ENVS = (None, "3", "45")     # DEEPSPEED_TIMEOUT unset / set


def runtime_trace(clip, pins, timeout_s):
    """clip(config) -> float; pins(config) -> [optimizer pin, param pin] (None: no section);
    timeout_s(DEEPSPEED_TIMEOUT or None) -> seconds."""
    base = {"train_batch_size": 1}
    return {"gradient_clipping": {k: clip({**base, **c}) for k, c in RUNTIME_CONFIGS.items()},
            "offload_pin_memory": {k: pins({**base, **c}) for k, c in RUNTIME_CONFIGS.items()},
            "pg_timeout_s": {str(env): timeout_s(env) for env in TIMEOUT_ENVS}}


# When the dynamic loss scale grows: a deliberate difference (dsfast doubles after `scale_window` clean steps, as
# DeepSpeed documents; DeepSpeed 0.19.8 one step later). 'O' overflow, '.' clean; hysteresis 1.
GROWTH_PATTERNS = (".......", "O.......")
GROWTH_ARGS = dict(init_scale=2.0 ** 8, scale_window=3, min_scale=1)


def growth_trace(make):
    """make() -> a scaler with GROWTH_ARGS and hysteresis 1; its scale after each step of each pattern."""
    out = {}
    for pattern in GROWTH_PATTERNS:
        scaler = make()
        out[pattern] = []
        for ch in pattern:
            scaler.update_scale(ch == "O")
            out[pattern].append(float(scaler.loss_scale))
    return out


def _with_env(name, value, fn):
    import os
    old = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        return fn()
    finally:
        os.environ.pop(name, None)
        if old is not None:
            os.environ[name] = old


def dsfast_runtime_defaults():
    from dsfast.comm.init import default_timeout
    from dsfast.config import load_config

    def pins(cfg):
        z = load_config(cfg, log_ignored=False).zero_optimization
        return [s.pin_memory if s is not None else None for s in (z.offload_optimizer, z.offload_param)]
    env = {k: v for k, v in __import__("os").environ.items() if k != "DSFAST_TIMEOUT_S"}
    return runtime_trace(lambda c: load_config(c, log_ignored=False).gradient_clipping, pins,
                         lambda v: default_timeout({**env, **({"DEEPSPEED_TIMEOUT": v} if v else {})})
                         .total_seconds())


def dsfast_growth():
    from dsfast.precision.loss_scaler import DynamicLossScaler
    return growth_trace(lambda: DynamicLossScaler(hysteresis=1, **GROWTH_ARGS))


# ------------------------------------------------------------------------------------------------ unmanaged accum.
def unmanaged_trace(initialize, gathered_parameters):
    """managed_gradient_accumulation=false in one process at stages 0-3 (tests/distributed/unmanaged_common.py):
    the boundary answers seen outside step(), global_samples after each step, (global_steps, micro_steps), and
    whether the weights equal plain PyTorch's (max abs difference <= 1e-6)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent / "distributed"))
    from unmanaged_common import reference, train
    out = {}
    for stage in (0, 1, 2, 3):
        engine, seen, samples = train(initialize, stage)
        params = list(engine.module.parameters())
        with gathered_parameters(params):
            diff = max(float((p.detach().float() - r).abs().max()) for p, r in zip(params, reference(world=1)))
        out[str(stage)] = {"seen": seen, "samples": samples, "steps": [engine.global_steps, engine.micro_steps],
                           "weights_as_torch": diff <= 1e-6}
    return out


# ------------------------------------------------------------------------------------------------ clipping runs
# A small MLP with a client torch Adam, fp32, its gradients far above the clip, so every step clips and Adam's first
# steps would turn a one-ulp difference in the clip coefficient into a visible one. Each case: a stage, the clip
# (DeepSpeed 0.19.8's default 1.0, and 0.3 where stage 0's max_norm / norm and stages 1-3's 1 / (norm / max_norm)
# round apart) and the optimizer's param groups (stages 1-3 take each group's norm, then their vector norm).
# Traced bit for bit: each step's loss, the global norm DeepSpeed reports, a hash of every parameter's bytes.
CLIP_CASES = [(stage, 1.0, 1) for stage in (0, 1, 2, 3)] + [(stage, 0.3, 2) for stage in (0, 1, 2, 3)]
CLIP_STEPS = 8
CLIP_MICRO = 4


def clip_case_id(stage, clip, groups):
    return f"stage {stage} clip {clip} groups {groups}"


def clip_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 24), torch.nn.Tanh(), torch.nn.Linear(24, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 3))


def clip_config(stage, clip, world=1):
    return {"train_micro_batch_size_per_gpu": CLIP_MICRO, "gradient_accumulation_steps": 1,
            "train_batch_size": CLIP_MICRO * world,
            "gradient_clipping": clip, "steps_per_print": 1000, "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": stage}}


def clip_optimizer(model, groups):
    """torch Adam over the model; with 2 groups the biases form the second (another lr)."""
    import torch
    if groups == 1:
        return torch.optim.Adam(model.parameters(), lr=1e-2)
    weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return torch.optim.Adam([{"params": weights}, {"params": biases, "lr": 3e-2}], lr=1e-2)


def clip_batch(step, rank=0, world=1):
    """This rank's part of step `step`'s global batch."""
    import torch
    g = torch.Generator().manual_seed(500 + step)
    x, y = torch.randn(CLIP_MICRO * world, 8, generator=g), 20 * torch.randn(CLIP_MICRO * world, 3, generator=g)
    mine = slice(rank * CLIP_MICRO, (rank + 1) * CLIP_MICRO)
    return x[mine], y[mine]


def params_digest(params):
    """sha256 over every parameter's fp32 bytes, in order (equal digests: bit-identical weights)."""
    import hashlib
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def clip_trace(initialize, gathered_parameters, stage, clip, groups, rank=0, world=1):
    """{"loss": [each step's loss], "norm": [each step's get_global_grad_norm()], "digest": [weights' hash]}
    (the loss: this rank's)."""
    import torch
    model = clip_model()
    engine = initialize(model=model, optimizer=clip_optimizer(model, groups),
                        config=clip_config(stage, clip, world))[0]
    out = {"loss": [], "norm": [], "digest": []}
    params = list(engine.module.parameters())
    for step in range(CLIP_STEPS):
        x, y = clip_batch(step, rank, world)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        out["loss"].append(float(loss.detach()))
        norm = engine.get_global_grad_norm()   # DeepSpeed's stage 0 in fp32 keeps none: None
        out["norm"].append(None if norm is None else float(norm))
        with gathered_parameters(params):
            out["digest"].append(params_digest(params))
    return out


def compare_bitwise(got, want, capability):
    """Losses, norms (where DeepSpeed reports one) and weights' digests equal; on other CPU kernels than the
    recording's, the losses to 1e-5 and a skip naming why the rest is not compared."""
    import pytest
    import torch
    here = torch.backends.cpu.get_cpu_capability()
    if here != capability:
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        pytest.skip(f"bit-for-bit needs the recording's CPU kernels ({capability}); this machine runs {here}")
    assert got["loss"] == want["loss"]
    assert got["digest"] == want["digest"]
    for mine, theirs in zip(got["norm"], want["norm"]):
        assert theirs is None or mine == theirs


def clip_traces(initialize, gathered_parameters):
    return {clip_case_id(*case): clip_trace(initialize, gathered_parameters, *case) for case in CLIP_CASES}


# ------------------------------------------------------------------------------------------------ DeepSpeed's side
def deepspeed_traces(kind):
    """DeepSpeed's traces of one kind of case (needs deepspeed importable; DS_ACCELERATOR=cpu without a GPU)."""
    return {"loss_scaler": _deepspeed_loss_scaler, "lr_schedules": _deepspeed_lr_schedules,
            "config_defaults": _deepspeed_config_defaults, "runtime_defaults": _deepspeed_runtime_defaults,
            "unmanaged_accumulation": _deepspeed_unmanaged, "clipping": _deepspeed_clipping}[kind]()


KINDS = ("loss_scaler", "lr_schedules", "config_defaults", "runtime_defaults", "unmanaged_accumulation", "clipping")


def _deepspeed_one_process():
    import os

    import deepspeed
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29517")):
        os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def _deepspeed_unmanaged():
    deepspeed = _deepspeed_one_process()
    return unmanaged_trace(lambda **kw: deepspeed.initialize(**kw), deepspeed.zero.GatheredParameters)


def _deepspeed_clipping():
    """One rank in this process, two gloo ranks launched (tests/distributed/worker_clip.py), and the CPU kernels'
    vector width they ran with (a bit-for-bit comparison needs the same one: reductions sum in its lanes)."""
    import tempfile

    import torch
    deepspeed = _deepspeed_one_process()
    one = clip_traces(lambda **kw: deepspeed.initialize(**kw), deepspeed.zero.GatheredParameters)
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "1 rank": one,
            "2 ranks": clip_traces_launched("deepspeed", 2, tempfile.mkdtemp())}


def clip_traces_launched(library, nprocs, tmp_dir, case_ids=()):
    """{case id: rank 0's trace} of `library` ("deepspeed" or "dsfast") on `nprocs` gloo ranks."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent / "distributed"))
    from dist_launch import launch
    out = Path(tmp_dir) / f"clip_{library}_{nprocs}.json"
    launch(str(Path(__file__).resolve().parent / "distributed" / "worker_clip.py"), [out, library, *case_ids],
           nprocs=nprocs, timeout=600)
    return json.loads(out.read_text())


def _deepspeed_runtime_defaults():
    import importlib

    import deepspeed.constants
    from deepspeed.runtime.config import DeepSpeedConfig

    def pins(cfg):
        z = DeepSpeedConfig(cfg).zero_config
        return [s.pin_memory if s is not None else None for s in (z.offload_optimizer, z.offload_param)]

    def timeout_s(env):   # DeepSpeed reads DEEPSPEED_TIMEOUT when deepspeed.constants is imported
        return _with_env("DEEPSPEED_TIMEOUT", env, lambda: importlib.reload(deepspeed.constants)
                         .default_pg_timeout.total_seconds())
    from deepspeed.runtime.fp16 import loss_scaler
    loss_scaler.dist.get_rank = lambda *a, **k: 0     # its overflow logging asks deepspeed.comm for the rank
    try:
        trace = runtime_trace(lambda c: float(DeepSpeedConfig(c).gradient_clipping), pins, timeout_s)
    finally:
        importlib.reload(deepspeed.constants)
    trace["loss_scale_growth"] = growth_trace(lambda: loss_scaler.DynamicLossScaler(
        delayed_shift=1, consecutive_hysteresis=False, **GROWTH_ARGS))
    return trace


def _deepspeed_loss_scaler():
    from deepspeed.runtime.fp16 import loss_scaler
    loss_scaler.dist.get_rank = lambda *a, **k: 0     # its overflow logging asks deepspeed.comm for the rank
    return {str(consecutive): loss_scale_trace(loss_scaler.DynamicLossScaler(
                **LOSS_SCALE_ARGS, delayed_shift=HYSTERESIS, consecutive_hysteresis=consecutive))
            for consecutive in (False, True)}


def _deepspeed_lr_schedules():
    from deepspeed.runtime import lr_schedules
    out = {}
    for name, params in LR_CASES:
        optimizer = lr_optimizer()
        out[lr_case_id(name, params)] = lr_trace(getattr(lr_schedules, name)(optimizer, **params), optimizer)
    return out


def _deepspeed_config_defaults():
    return {theirs[1]: config_fields(model_class(theirs)) for theirs, _ in CONFIG_PAIRS}


# ------------------------------------------------------------------------------------------------ golden files
def golden_path(kind):
    return DATA / f"deepspeed_{kind}.json"


def load_golden(kind):
    """The recorded traces of `kind`; a missing or foreign file says how to regenerate it."""
    path = golden_path(kind)
    regen = "DS_ACCELERATOR=cpu python tests/data/make_deepspeed_goldens.py (with DeepSpeed importable)"
    if not path.is_file():
        raise FileNotFoundError(f"golden file {path} is missing; regenerate it with {regen}")
    data = json.loads(path.read_text())
    if data.get("deepspeed") != GOLDEN_DEEPSPEED:
        raise ValueError(f"{path} was recorded from DeepSpeed {data.get('deepspeed')!r}, the tests expect "
                         f"{GOLDEN_DEEPSPEED}; regenerate it with {regen}")
    return data["traces"]
