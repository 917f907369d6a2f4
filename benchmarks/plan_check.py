"""The offload plan's predictions against real runs on this machine: for three configurations, the predicted
optimizer-step floor and host bytes per rank (dsfast.zero.plan, from this machine's measured figures) beside the
measured median engine.step() time and memory_breakdown() host bytes of one process training a bf16 MLP.

    python benchmarks/plan_check.py --params 2.5e8 [--steps 6] [--nvme-path /local/nvme]

Configurations (stage 2, one rank): offload_optimizer "cpu" with fp32 masters and moments; "cpu" with bf16 masters
and moments; and with --nvme-path, "nvme" (fp32). Each trains in a fresh process (OMP_NUM_THREADS = all cores).
Run it on an idle machine: the floor is a lower bound from the bandwidth measured in the same run, so the ratio
measured / predicted is what the plan's ranking rests on. The host bytes compared are the model states only
(memory_breakdown), as the plan counts them; on a machine without an accelerator the device bytes are host bytes
too and are added to the prediction.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dsfast.zero.host_figures import measure_host  # noqa: E402
from dsfast.zero.plan import make_plan  # noqa: E402

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
times = []
for _ in range(steps):
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.step()
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
total = engine.memory_breakdown()["total"]
print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "step_s": times,
                  "median_step_s": statistics.median(times[1:] or times), "host_bytes": total.get("host", 0)}))
"""


def configurations(nvme_path):
    out = [("cpu, fp32 masters + moments", {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            {"enabled": True}, (2, True, False, "fp32", "fp32")),
           ("cpu, bf16 masters + moments", {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
            (2, True, False, "bf16", "bf16"))]
    if nvme_path:
        out.append(("nvme, fp32 masters + moments",
                    {"stage": 2, "reduce_bucket_size": int(2e7),
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
    for name, zero, bf16, key in configurations(args.nvme_path):
        res = subprocess.run([sys.executable, "-c", CHILD, repo, str(args.params), str(args.steps), json.dumps(zero),
                              json.dumps(bf16), str(args.width)], capture_output=True, text=True, env=env)
        if res.returncode != 0:
            sys.exit(f"the {name} run failed:\n{res.stderr[-3000:]}")
        run = json.loads(res.stdout.strip().splitlines()[-1])
        rows = make_plan(run["params"], 1, fig, 1, bucket=zero.get("reduce_bucket_size", 5e8),
                         only=lambda r: (r["stage"], r["offload_optimizer"], r["offload_param"], r["masters"],
                                         r["states"]) == key)
        row = rows[0]
        host = row["host"] + (row["device"] if fig.device_memory is None else 0)
        print(json.dumps({"config": name, **run, "predicted_floor_s": row["floor_s"], "predicted_host_bytes": host}))
        print(f"{name:>30}: step {run['median_step_s'] * 1e3:8.1f} ms, floor {row['floor_s'] * 1e3:8.1f} ms "
              f"(x{run['median_step_s'] / row['floor_s']:.2f}); host {run['host_bytes'] / gib:.2f} GiB, predicted "
              f"{host / gib:.2f} GiB (x{run['host_bytes'] / host:.3f})")


if __name__ == "__main__":
    main()
