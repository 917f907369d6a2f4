"""Loading 8-bit optimizer states (offload_optimizer.state_precision "int8"): time and peak memory of
load_checkpoint on one rank, on the saved block grid (a resume) and on another one (saved by 2 ranks), against the
same model with fp32 states (the peer: what a load without codes costs), and the ceiling: reading the checkpoint's
files once from the warm page cache.

    python benchmarks/checkpoint_8bit_load.py                       # 64M parameters, 3 rounds, in /tmp
    python benchmarks/checkpoint_8bit_load.py --width 1024 --rounds 1   # a quick check that it runs

Every load runs in a process of its own (ru_maxrss is per process): "peak over engine" is the peak RSS during
load_checkpoint less the RSS before it. The page cache is warm (the files were just written).
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def config(args, stage, precision):
    off = {"device": "cpu"}
    if precision == "int8":
        off["state_precision"] = "int8"
    return {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e8, "offload_optimizer": off}}


def engine(args, precision, stage=2):
    import torch
    import dsfast
    torch.manual_seed(0)
    # a width not a multiple of 256 with biases: 2 ranks split the parameters mid-block
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=config(args, stage, precision),
                             dist_init_required="WORLD_SIZE" in os.environ)[0]


def save(args):
    import torch
    e = engine(args, args.precision)
    x = torch.randn(2, args.width)
    e.backward(e(x).float().pow(2).mean())
    e.step()
    e.save_checkpoint(args.dir, tag="t")


def load(args):
    e = engine(args, args.precision)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    e.load_checkpoint(args.dir, tag="t")
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"load_s": seconds, "peak_over_engine_gb": (peak - before) / 1e6, "rss_before_gb": before / 1e6}))


def read_seconds(directory):
    """The ceiling of a load from a warm page cache: reading every file of the checkpoint once into memory."""
    names = [os.path.join(root, f) for root, _, files in os.walk(directory) for f in files]
    buf = bytearray(64 << 20)
    t0 = time.perf_counter()
    for name in names:
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - t0, sum(os.path.getsize(n) for n in names)


def child(args, role, precision, directory, ranks=1):
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--precision", precision, "--dir", directory,
           "--width", str(args.width), "--layers", str(args.layers)]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_port",
               str(29500 + os.getpid() % 1000)] + cmd[1:]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"{role} ({precision}, {ranks} rank(s)) failed:\n{out.stderr[-3000:]}")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    result["requantized"] = "re-quantized" in out.stdout + out.stderr   # the loader's conversion log line
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=4100)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    ap.add_argument("--role", choices=["save", "load"], help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="int8", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "save":
        return save(args)
    if args.role == "load":
        return load(args)
    root = tempfile.mkdtemp(dir=args.dir)
    try:
        cases = {"int8, same grid (saved by 1 rank)": ("int8", os.path.join(root, "q1"), 1),
                 "int8, grid moved (saved by 2 ranks)": ("int8", os.path.join(root, "q2"), 2),
                 "fp32 states (saved by 1 rank)": ("fp32", os.path.join(root, "f1"), 1)}
        for precision, directory, ranks in cases.values():
            child(args, "save", precision, directory, ranks)
        params = args.layers * (args.width * args.width + args.width)
        print(f"{params / 1e6:.1f}M parameters ({args.layers} x Linear({args.width}, {args.width})), load on 1 rank "
              f"at stage 2, {args.threads} threads; best of {args.rounds} (peak of the same run)")
        print(f"   {'case':<38}{'load s':>8}{'peak over engine GB':>21}  re-quantized")
        best = {}
        for _ in range(args.rounds):   # the cases interleaved
            for name, (precision, directory, _) in cases.items():
                r = child(args, "load", precision, directory)
                if name not in best or r["load_s"] < best[name]["load_s"]:
                    best[name] = r
        for name, r in best.items():
            print(f"   {name:<38}{r['load_s']:>8.2f}{r['peak_over_engine_gb']:>21.2f}  "
                  f"{'yes' if r['requantized'] else 'no'}")
        for name, (_, directory, _) in cases.items():   # the ceiling: the files read once (best of 3)
            seconds, nbytes = min(read_seconds(directory) for _ in range(3))
            print(f"   ceiling for {name}: {nbytes / 1e9:.2f} GB read in {seconds:.2f} s; the load takes "
                  f"{best[name]['load_s'] / seconds:.1f}x that")
        fp32 = best["fp32 states (saved by 1 rank)"]["load_s"]
        for name in list(cases)[:2]:
            print(f"   {name}: {best[name]['load_s'] / fp32:.2f}x the fp32-state load")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
