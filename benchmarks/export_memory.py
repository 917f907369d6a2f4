"""Peak memory of a streamed export (`dsfast consolidate`'s export) against the bound it promises: the largest
output tensor plus one input read buffer (the largest input slice or the 8 MB checksum chunk, whichever is
larger).

    python benchmarks/export_memory.py --tensors 40 --numel 1048576 [--kind dsfast|deepspeed] [--dir D]

builds a checkpoint of `tensors` parameters of `numel` fp32 elements (dsfast: an engine at ZeRO stage 2 on one
rank; deepspeed: a DeepSpeed 0.19 stage-2 folder of `--ranks` ranks in DeepSpeed's format, written directly),
then, in a fresh process, measures the resident memory growth (VmHWM after the export minus VmRSS before, the
peak reset first where /proc/self/clear_refs allows) of the export to a sharded Hugging Face folder, of
`dsfast convert-deepspeed` (DeepSpeed checkpoints), and of building the whole state_dict with consolidate() for
comparison. Prints one JSON object.
tests/test_checkpoint_export_memory.py runs it at the size the issue names.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MB = 1 << 20
HASH_CHUNK = 8 * MB      # dsfast.checkpoint.safetensors_io._HASH_CHUNK


def build_dsfast(path, tensors, numel):
    import torch
    import dsfast
    class Params(torch.nn.Module):       # parameters only: building 40M Linear weights' init would dominate
        def __init__(self):
            super().__init__()
            self.w = torch.nn.ParameterList(torch.nn.Parameter(torch.full((numel,), float(i)))
                                            for i in range(tensors))

    model = Params()
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, _, _, _ = dsfast.initialize(model=model, config=cfg, dist_init_required=False)
    engine.save_checkpoint(path, "t")


def build_deepspeed(path, tensors, numel, ranks, states=("exp_avg", "exp_avg_sq"), tied=False):
    """A DeepSpeed 0.19 ZeRO stage-2 tag folder (one param group, the flat group split evenly over `ranks`);
    tied: the module also holds "tied.weight", a second name of "0.weight" (DeepSpeed's shared_params)."""
    import types
    from dsfast.checkpoint.ds_unpickle import STAND_INS
    fragment = next(c for c in STAND_INS if c.__name__ == "fragment_address")
    parts = fragment.__module__.split(".")       # pickle looks the class up by its (DeepSpeed) module name
    added = [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    sys.modules[fragment.__module__].fragment_address = fragment
    try:
        _write_deepspeed(path, tensors, numel, ranks, states, tied, fragment)
    finally:   # the stand-in modules go: a test process must not keep a `deepspeed` that is not DeepSpeed
        for name in added:
            sys.modules.pop(name, None)


def _write_deepspeed(path, tensors, numel, ranks, states, tied, fragment):
    import collections
    import torch
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(0)
    names = [f"{i}.weight" for i in range(tensors)]
    full = torch.randn(tensors * numel)
    module = {n: full[i * numel:(i + 1) * numel].reshape(numel // 1024, 1024).to(torch.bfloat16)
              for i, n in enumerate(names)}
    shapes = collections.OrderedDict((n, torch.Size(module[n].shape)) for n in names)
    shared = {}
    if tied:
        module["tied.weight"], shared["tied.weight"] = module["0.weight"], "0.weight"
    torch.save({"module": module, "buffer_names": [], "param_shapes": [shapes], "shared_params": shared,
                "global_steps": 1,
                "dp_world_size": ranks, "ds_config": {"bf16": {"enabled": True}}},
               os.path.join(path, "mp_rank_00_model_states.pt"))
    per = -(-full.numel() // ranks)
    for r in range(ranks):
        lo, hi = r * per, min((r + 1) * per, full.numel())
        flat = full[lo:hi].clone()
        mapping = collections.OrderedDict()
        for i, n in enumerate(names):
            a, b = max(lo, i * numel), min(hi, (i + 1) * numel)
            if a < b:
                mapping[n] = fragment(numel=b - a, start=a - lo)
        state = {"step": torch.tensor(1.0), **{k: torch.rand_like(flat) for k in states}}
        osd = {"zero_stage": 2, "partition_count": [ranks], "loss_scaler": None,
               "single_partition_of_fp32_groups": [flat], "param_slice_mappings": [mapping],
               "base_optimizer_state": {"state": [state], "param_groups": [{"lr": 1e-3, "params": [0]}]}}
        torch.save({"optimizer_state_dict": osd},
                   os.path.join(path, f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt"))


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _growth(fn):
    import gc
    gc.collect()
    before = _status("VmRSS")
    reset = _reset_peak()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    return _status("VmHWM") - before, seconds, reset, result


def _is_deepspeed(D, path):
    if D.is_deepspeed_checkpoint(path):
        return True
    latest = os.path.join(path, "latest")
    return os.path.exists(latest) and D.is_deepspeed_checkpoint(os.path.join(path, open(latest).read().strip()))


def measure(ckpt, out, max_shard_size):
    """In this (fresh) process: the growth of the export, then of consolidate() for comparison."""
    import importlib
    import torch  # noqa: F401  (imported before the baseline)
    for name in ("export_hf", "export_sources", "deepspeed_import", "pages"):
        importlib.import_module(f"dsfast.checkpoint.{name}")
    C = importlib.import_module("dsfast.checkpoint.consolidate")
    found, _ = C.entries(ckpt)
    largest = max(e.numel * e.dtype.itemsize for e in found)
    export_growth, export_s, reset, (_, files) = _growth(lambda: C.export(ckpt, out, max_shard_size=max_shard_size))
    convert = {}
    D = importlib.import_module("dsfast.checkpoint.deepspeed_import")
    if _is_deepspeed(D, ckpt):          # `dsfast convert-deepspeed` too
        growth, secs, _, _ = _growth(lambda: D.convert(ckpt, out + "-converted"))
        convert = {"convert_growth": growth, "convert_s": round(secs, 3)}
    dict_growth, dict_s, _, sd = _growth(lambda: C.consolidate(ckpt))
    total_in = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(ckpt) for f in fs)
    return {"largest_tensor": largest, "read_buffer": max(largest, HASH_CHUNK),
            "bound": largest + max(largest, HASH_CHUNK), "checkpoint_bytes": total_in,
            "output_bytes": sum(os.path.getsize(os.path.join(out, f)) for f in files), "files": len(files),
            "export_growth": export_growth, "export_s": round(export_s, 3),
            "consolidate_dict_growth": dict_growth, "consolidate_dict_s": round(dict_s, 3), "peak_reset": reset,
            "tensors": len(sd), **convert}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tensors", type=int, default=40)
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--kind", choices=["dsfast", "deepspeed"], default="dsfast")
    p.add_argument("--ranks", type=int, default=2, help="DeepSpeed ranks (--kind deepspeed)")
    p.add_argument("--max-shard-size", default="50MB")
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed after)")
    p.add_argument("--measure", nargs=2, metavar=("CKPT", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1], args.max_shard_size)))
        return 0
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        ckpt = os.path.join(work, "ck")
        if args.kind == "dsfast":
            build_dsfast(ckpt, args.tensors, args.numel)
        else:
            build_deepspeed(os.path.join(ckpt, "global_step1"), args.tensors, args.numel, args.ranks)
            with open(os.path.join(ckpt, "latest"), "w") as f:
                f.write("global_step1")
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", ckpt, os.path.join(work, "hf"),
                            "--max-shard-size", args.max_shard_size], capture_output=True, text=True)
        if r.returncode:
            sys.stderr.write(r.stderr)
            return r.returncode
        print(r.stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
