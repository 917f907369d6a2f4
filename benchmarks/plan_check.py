"""The offload plan's predictions against real runs on this machine: for four configurations, the predicted
optimizer-step floor and host bytes per rank (dsfast.zero.planning.plan, from this machine's measured figures) beside
the
measured median optimizer time within engine.step(), the whole engine.step(), and memory_breakdown() host bytes of
one process training a bf16 MLP.

    python benchmarks/plan_check.py --params 2.5e8 [--steps 6] [--nvme-path /local/nvme]

Configurations (stage 2, one rank): offload_optimizer "cpu" with fp32 masters and moments; "cpu" with bf16 masters
and moments; "cpu" with fp32 masters and 8-bit moments (state_precision "int8"); and with --nvme-path, "nvme"
(fp32). Each trains in a fresh process (OMP_NUM_THREADS = all cores). Run it on an idle machine: the floor is a
lower bound from the bandwidth measured in the same run, so the ratio measured / predicted is what the plan's
ranking rests on.
What is compared: the floor counts the optimizer's bytes (and with NVMe the swap's), so the ratio is taken against
the optimizer's own time (the owner's walk of the shard units through the optimizer, step_shards) and,
for NVMe, against engine.step() (the disk is the floor there; the swap bytes the step read and wrote are printed
beside the plan's count: the first units are read ahead during forward and backward). engine.step() is printed for
every row: what it spends beyond the optimizer (the gradient-norm / overflow pass, the 16-bit copy back) is not in
the floor. The host bytes are the model states only (memory_breakdown), as the plan counts them; on a machine
without an accelerator the device bytes are host bytes too (plan.host_bytes). The NVMe row's reduce_bucket_size is
one layer, so each swap unit is one layer and the window the plan sizes from the bucket is the one the run builds.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dsfast.zero.planning.host_figures import measure_host  # noqa: E402
from dsfast.zero.planning.plan import host_bytes, make_plan  # noqa: E402

CHILD = r"""
import json, statistics, sys, time
import torch
sys.path.insert(0, sys.argv[1])
import dsfast
params, steps, zero, bf16 = int(float(sys.argv[2])), int(sys.argv[3]), json.loads(sys.argv[4]), json.loads(sys.argv[5])
width = int(sys.argv[6])
layers = max(1, round(params / (width * width)))
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
cfg = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
       "bf16": bf16, "zero_optimization": zero}
engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg, dist_init_required=False)[0]
x = torch.randn(4, width, device=engine.device, dtype=torch.bfloat16)
opt_time = [0.0]
# the optimizer's part of engine.step(): the owner's walk of the shard units (step_shards, which steps through the
# optimizer's per-unit entry, not optimizer.step(), so step hooks never fire)
owner_base = next(c for c in type(engine.state_owner).__mro__ if c.__name__ == "ShardedBase")
owner_module = sys.modules[owner_base.__module__]
walk = owner_module.step_shards


def timed_walk(*args, **kwargs):
    t0 = time.perf_counter()
    try:
        return walk(*args, **kwargs)
    finally:
        opt_time[0] += time.perf_counter() - t0


owner_module.step_shards = timed_walk
times, opt_times, swapped = [], [], []
for _ in range(steps):
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    before, opt_time[0] = engine.swap_bytes(), 0.0
    t0 = time.perf_counter()
    engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    opt_times.append(opt_time[0])
    after = engine.swap_bytes()
    if after is not None:
        swapped.append((after[0] - before[0], after[1] - before[1]))
total = engine.memory_breakdown()["total"]
med = lambda v: statistics.median(v[1:] or v)
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "step_s": times, "optimizer_s": opt_times,
                  "median_step_s": med(times), "median_optimizer_s": med(opt_times),
                  "swap_read_bytes": med([r for r, _ in swapped]) if swapped else 0,
                  "swap_written_bytes": med([w for _, w in swapped]) if swapped else 0,
                  "host_bytes": total.get("host", 0)}))
"""


def configurations(nvme_path, width):
    out = [("cpu, fp32 masters + moments", {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            {"enabled": True}, (2, True, False, "fp32", "fp32")),
           ("cpu, bf16 masters + moments", {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
            (2, True, False, "bf16", "bf16")),
           ("cpu, fp32 masters + int8 moments",
            {"stage": 2, "offload_optimizer": {"device": "cpu", "state_precision": "int8"}},
            {"enabled": True}, (2, True, False, "fp32", "int8"))]
    if nvme_path:
        out.append(("nvme, fp32 masters + moments",
                    {"stage": 2, "reduce_bucket_size": width * width,
                     "offload_optimizer": {"device": "nvme", "nvme_path": nvme_path, "buffer_count": 4}},
                    {"enabled": True}, (2, "nvme", False, "fp32", "fp32")))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=float, default=2.5e8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--nvme-path", default=None)
    ap.add_argument("--width", type=int, default=4096, help="the MLP's width (layers: params / width^2)")
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fig = measure_host(args.nvme_path)
    env = dict(os.environ, OMP_NUM_THREADS=str(os.cpu_count()))
    gib = float(1 << 30)
    print(f"host {fig.host_gbs:.1f} GB/s in place" + (f", disk read {fig.nvme_read_gbs:.2f} / write "
                                                      f"{fig.nvme_write_gbs:.2f} GB/s" if args.nvme_path else ""))
    for name, zero, bf16, key in configurations(args.nvme_path, args.width):
        res = subprocess.run([sys.executable, "-c", CHILD, repo, str(args.params), str(args.steps), json.dumps(zero),
                              json.dumps(bf16), str(args.width)], capture_output=True, text=True, env=env)
        if res.returncode != 0:
            sys.exit(f"the {name} run failed:\n{res.stderr[-3000:]}")
        run = json.loads(res.stdout.strip().splitlines()[-1])
        buffers = zero["offload_optimizer"].get("buffer_count", 4)
        rows = make_plan(run["params"], 1, fig, 1, bucket=zero.get("reduce_bucket_size", 5e8), buffer_count=buffers,
                         only=lambda r: (r["stage"], r["offload_optimizer"], r["offload_param"], r["masters"],
                                         r["states"]) == key)
        row = rows[0]
        host = host_bytes(row, fig)
        floor = row["floor_s"]
        nvme = row["offload_optimizer"] == "nvme"
        measured = run["median_step_s"] if nvme else run["median_optimizer_s"]
        print(json.dumps({"config": name, **run, "predicted_floor_s": floor, "predicted_host_bytes": host,
                          "predicted_nvme_bytes": row.get("nvme", 0)}))
        what = "engine.step()" if nvme else "optimizer"
        line = (f"{name:>33}: {what} {measured * 1e3:8.1f} ms, floor {floor * 1e3:8.1f} ms (x{measured / floor:.2f}); "
                f"engine.step() {run['median_step_s'] * 1e3:.1f} ms; host {run['host_bytes'] / gib:.2f} GiB, "
                f"predicted {host / gib:.2f} GiB (x{run['host_bytes'] / host:.3f})")
        if nvme:
            line += (f"; swap per step read {run['swap_read_bytes'] / gib:.2f} / written "
                     f"{run['swap_written_bytes'] / gib:.2f} GiB, files {row['nvme'] / gib:.2f} GiB")
        print(line)

if __name__ == "__main__":
    main()
