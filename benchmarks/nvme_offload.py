"""NVMe swap throughput: the swap engine (zero/nvme/io.py + nvme_window.py) against the disk's own sequential
O_DIRECT bandwidth, measured in the same run on the same directory.

    python benchmarks/nvme_offload.py --dir /var/tmp --total-mib 1024 --unit-mib 64
    python benchmarks/nvme_offload.py --dir /var/tmp --total-mib 64 --unit-mib 8 --repeats 1   # a quick check
    python benchmarks/nvme_offload.py --dir /var/tmp --train --params 2.5e8 --steps 4   # CPU vs NVMe offload

Ceiling: one thread writing (then reading) one file with O_DIRECT in 8 MiB calls, the plainest sequential stream
(and `dd oflag=direct` / `iflag=direct` beside it). Swap engine: `total` bytes in units of `unit` bytes, as a step
sees them: write every unit (store), read every unit through the window (prefetch ahead, acquire, discard), and a
step pass (acquire, release: reads and writes together), buffer_count host buffers, its thread pool. Every figure
is the median of --repeats; the data round trip is checked bit-exact before timing. A tmpfs directory is refused
(it measures memory, not a disk).

--train: one process at stage 2 (bf16) trains the same MLP with CPU offload, then with NVMe offload (each in a fresh
process), and prints the peak RSS beside the size of the states (12 bytes per parameter), the step time, the bytes
read and written per step and the loss. (The 2.5B-parameter, 2-rank stage 3 demonstration with the parameters on
NVMe too, and DeepSpeed's beside it: benchmarks/nvme_demo.py.)
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from dsfast.zero.planning.host_figures import DISK_CHUNK as CHUNK, disk_bandwidth  # noqa: E402
from dsfast.zero.nvme.files import SwapDir  # noqa: E402
from dsfast.zero.nvme.io import SwapIO  # noqa: E402
from dsfast.zero.nvme.window import UnitWindow  # noqa: E402

MIB = 1 << 20


def fs_type(path):
    return subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True).stdout.strip()


def ceiling(path, total, streams=1):
    """(write MB/s, read MB/s) of O_DIRECT streams over one file of `total` bytes (host_figures.disk_bandwidth,
    the measurement `dsfast plan` makes too)."""
    return disk_bandwidth(path, total, streams)


def dd(path, total):
    """(write MB/s, read MB/s) of dd with direct I/O (its own figure), or None where dd is missing."""
    if shutil.which("dd") is None:
        return None
    f = os.path.join(path, "dd.bin")
    out = []
    for args in (["if=/dev/zero", f"of={f}", "oflag=direct", "conv=fsync"], [f"if={f}", "of=/dev/null",
                                                                              "iflag=direct"]):
        res = subprocess.run(["dd", *args, f"bs={CHUNK}", f"count={total // CHUNK}"], capture_output=True,
                             text=True)
        m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", res.stderr)
        out.append(int(m.group(1)) / float(m.group(2)) / 1e6 if m else float("nan"))
    os.unlink(f)
    return tuple(out)


def swap_engine(path, total, unit, buffer_count, threads, block_size, check=False):
    """(write MB/s, read MB/s, step MB/s of read + written bytes) of the swap engine."""
    n = total // unit
    io, d = SwapIO(threads=threads, block_size=block_size), SwapDir(path)
    w = UnitWindow(io, d, buffer_count)
    seed = torch.randint(0, 256, (unit,), dtype=torch.uint8)
    try:
        def fill(i):   # the checked run writes known bytes; a timed one writes what the buffer holds (the
            # caller's copy is not the disk's time)
            return (lambda buf: buf.tensor[:unit].copy_(seed.roll(i))) if check else (lambda buf: None)
        t0 = time.perf_counter()
        for i in range(n):
            w.store(i, fill(i), unit)
        w.flush()
        t_write = time.perf_counter() - t0
        ahead = max(1, buffer_count - 2)

        def sweep(release):
            for i in range(min(ahead, n)):
                w.prefetch(i)
            for i in range(n):
                buf = w.acquire(i)
                if check:
                    assert torch.equal(buf.tensor[:unit], seed.roll(i)), f"unit {i} came back different"
                w.release(i, unit) if release else w.discard(i)
                if i + ahead < n:
                    w.prefetch(i + ahead)
            w.flush()
        t0 = time.perf_counter()
        sweep(False)
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        sweep(True)
        t_step = time.perf_counter() - t0
    finally:
        w.close()
        io.close()
        d.close()
    return total / t_write / 1e6, total / t_read / 1e6, 2 * total / t_step / 1e6


TRAIN_CHILD = r"""
import json, os, resource, statistics, sys, time
import torch
sys.path.insert(0, sys.argv[1])
params, where, bucket, buffers, steps = float(sys.argv[2]), sys.argv[3], float(sys.argv[4]), int(sys.argv[5]), \
    int(sys.argv[6])
stage, impl = int(sys.argv[7]), sys.argv[8]
if impl == "deepspeed":
    import deepspeed as dsfast
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    dsfast.init_distributed(dist_backend="gloo")
else:
    import dsfast


def disk_io():   # the kernel's count of this process's bytes to and from storage (both implementations alike)
    d = dict(l.split(":") for l in open("/proc/self/io"))
    return int(d["read_bytes"]), int(d["write_bytes"])
width = 2048
layers = max(1, int(params // (width * width + width)))
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh())
                              for _ in range(layers)])
off = {"device": "cpu"} if where == "cpu" else {"device": "nvme", "nvme_path": where, "buffer_count": buffers}
cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10 ** 6, "bf16": {"enabled": True},
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
       "zero_optimization": {"stage": stage, "reduce_bucket_size": int(bucket), "offload_optimizer": off,
                             "sub_group_size": int(bucket)}}
if where != "cpu":
    cfg["aio"] = {"block_size": int(sys.argv[9]), "queue_depth": 8, "single_submit": False,
                  "overlap_events": True, "thread_count": 2}
psi = sum(p.numel() for p in model.parameters())   # before stage 3 partitions them
t_init = time.perf_counter()
engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                           dist_init_required=False)[0]
t_init = time.perf_counter() - t_init
g = torch.Generator().manual_seed(1)
x, y = torch.randn(8, width, generator=g).bfloat16(), torch.randn(8, width, generator=g)
losses, times, io = [], [], []
for _ in range(steps):
    t0 = time.perf_counter()
    before = disk_io()
    loss = torch.nn.functional.mse_loss(engine(x).float(), y)
    engine.backward(loss)
    engine.step()
    times.append(time.perf_counter() - t0)
    losses.append(float(loss))
    io.append([a - b for a, b in zip(disk_io(), before)])
mb = engine.memory_breakdown()["total"] if impl == "dsfast" else None
print(json.dumps({"impl": impl, "stage": stage, "init_s": t_init,
                  "where": "nvme" if where != "cpu" else "cpu", "params": psi, "states_bytes": 12 * psi,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "rss_after_steps_bytes": int(dict(l.split(":", 1) for l in open("/proc/self/status"))[
                      "VmRSS"].split()[0]) * 1024,
                  "step_s": times, "median_step_s": statistics.median(times[1:] or times), "losses": losses,
                  "io_per_step": io, "memory_breakdown": mb}))
"""


def train(args):
    """Stage 2, bf16, one process: CPU offload against NVMe offload of the same model, each in a fresh process:
    peak RSS beside the size of the states, step time, bytes read and written per step, the loss."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = os.path.join(args.dir, f"dsfast-nvme-train-{os.getpid()}")
    os.makedirs(work)
    out = []
    runs = [("dsfast", "cpu")] * (not args.skip_cpu) + [("dsfast", work)] + \
        ([("deepspeed", work)] if args.deepspeed else [])
    try:
        for impl, where in runs:
            python = args.deepspeed if impl == "deepspeed" else sys.executable
            env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count()), DS_ACCELERATOR="cpu")
            res = subprocess.run([python, "-c", TRAIN_CHILD, repo, str(args.params), where, str(args.bucket),
                                  str(args.buffer_count), str(args.steps), str(args.stage), impl,
                                  str(args.block_size)],
                                 capture_output=True, text=True, env=env)
            if res.returncode != 0:
                sys.exit(f"the {impl} {where} run failed:\n{res.stderr[-3000:]}")
            out.append(json.loads(res.stdout.strip().splitlines()[-1]))
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gib = float(1 << 30)
    for r in out:
        io = r["io_per_step"][-1]
        print(json.dumps(r))
        print(f"{r['impl']:>9} {r['where']:>4} stage {r['stage']}: init {r['init_s']:.1f} s, {r['params'] / 1e6:.0f}M params, states {r['states_bytes'] / gib:.2f} GiB, peak RSS "
              f"{r['peak_rss_bytes'] / gib:.2f} GiB (after the steps {r['rss_after_steps_bytes'] / gib:.2f}), step {r['median_step_s']:.2f} s (median after the first), "
              f"loss {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}"
              + f", disk read {io[0] / gib:.2f} GiB written {io[1] / gib:.2f} GiB in the last step")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", action="store_true", help="train a model with CPU and with NVMe offload instead")
    ap.add_argument("--params", type=float, default=2.5e8, help="--train: model parameters")
    ap.add_argument("--bucket", type=float, default=2e7, help="--train: reduce_bucket_size (the NVMe unit)")
    ap.add_argument("--steps", type=int, default=4, help="--train: optimizer steps")
    ap.add_argument("--stage", type=int, default=2, help="--train: ZeRO stage")
    ap.add_argument("--skip-cpu", action="store_true", help="--train: no CPU offload run")
    ap.add_argument("--deepspeed", default=None, metavar="PYTHON",
                    help="--train: also DeepSpeed's NVMe offload, run by this python (DS_ACCELERATOR=cpu; its "
                         "async_io op needs libaio-dev; DeepSpeed swaps at stage 3 only)")
    ap.add_argument("--dir", default="/var/tmp")
    ap.add_argument("--total-mib", type=int, default=1024)
    ap.add_argument("--unit-mib", type=int, default=64)
    ap.add_argument("--buffer-count", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=CHUNK, help="bytes per read / write call (--train: aio.block_size)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    kind = fs_type(args.dir)
    if kind == "tmpfs":
        sys.exit(f"{args.dir} is tmpfs: it measures memory, not a disk; give a directory on the disk (--dir)")
    if args.train:
        return train(args)
    total, unit = args.total_mib * MIB, args.unit_mib * MIB
    total -= total % CHUNK
    work = os.path.join(args.dir, f"dsfast-nvme-bench-{os.getpid()}")
    os.makedirs(work)
    try:
        swap_engine(work, 4 * unit, unit, args.buffer_count, args.threads, args.block_size, check=True)
        rows = {"ceiling": [], "ceiling_qd": [], "dd": [], "swap": []}
        for _ in range(args.repeats):   # interleaved, so that a noisy neighbour hits both alike
            rows["ceiling"].append(ceiling(work, total))
            rows["ceiling_qd"].append(ceiling(work, total, streams=args.threads))
            rows["dd"].append(dd(work, total))
            rows["swap"].append(swap_engine(work, total, unit, args.buffer_count, args.threads, args.block_size))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: [statistics.median(x[j] for x in v) for j in range(len(v[0]))] for k, v in rows.items()
           if v and v[0] is not None}
    # ratios within each repeat (a neighbour's load hits both sides of one repeat alike), then their median;
    # the step's ceiling: the same bytes read, then written, by the single stream
    def ratios_to(key):
        return [(s_[0] / c[0], s_[1] / c[1], s_[2] / (2 / (1 / c[0] + 1 / c[1])))
                for c, s_ in zip(rows[key], rows["swap"])]
    ratios = ratios_to("ceiling")
    rw, rr, rs = (statistics.median(r[j] for r in ratios) for j in range(3))
    qw, qr, qs = (statistics.median(r[j] for r in ratios_to("ceiling_qd")) for j in range(3))
    cw, cr = med["ceiling"]
    sw, sr, ss = med["swap"]
    print(json.dumps({"dir": args.dir, "fs": kind, "total_mib": args.total_mib, "unit_mib": args.unit_mib,
                      "buffer_count": args.buffer_count, "threads": args.threads, "block_size": args.block_size,
                      "repeats": args.repeats, "runs": rows, "ratios": ratios}))
    print(f"disk ceiling (1 thread, O_DIRECT, 8 MiB calls): write {cw:.0f} MB/s, read {cr:.0f} MB/s (medians)")
    print(f"disk at {args.threads} streams (O_DIRECT, 8 MiB calls):   write {med['ceiling_qd'][0]:.0f} MB/s, "
          f"read {med['ceiling_qd'][1]:.0f} MB/s (medians)")
    if "dd" in med:
        print(f"dd direct (8 MiB blocks):                     write {med['dd'][0]:.0f} MB/s, "
              f"read {med['dd'][1]:.0f} MB/s")
    print(f"swap engine ({args.unit_mib} MiB units, {args.buffer_count} buffers, {args.threads} threads): "
          f"write {sw:.0f} MB/s, read {sr:.0f} MB/s, step (read + write) {ss:.0f} MB/s")
    print(f"swap / ceiling, median of per-repeat ratios: write {100 * rw:.0f}%, read {100 * rr:.0f}%, "
          f"step {100 * rs:.0f}% (target: 80%)")
    print(f"swap / the disk at {args.threads} streams:                write {100 * qw:.0f}%, read {100 * qr:.0f}%, "
          f"step {100 * qs:.0f}%")

if __name__ == "__main__":
    main()
