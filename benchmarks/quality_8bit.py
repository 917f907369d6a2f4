"""Training quality of 8-bit Adam moments against fp32 moments: the same engine (stage 2, offload_optimizer "cpu",
so both step on the host: CPUAdam vs CPUAdam8bit), the same seeds, two models of different kinds. Not a timing.

    python benchmarks/quality_8bit.py [--models gpt,lstm] [--seeds 0,1,2] [--steps 200] [--every 20]
                                      [--threads 1] [--json out.json]

gpt:  examples/gpt (the README's main job): the byte-level GPT of model.py (d_model 128, 4 layers) on
      examples/gpt/data/founding.txt with examples/gpt/ds_config.json's optimizer, clipping and warmup/decay schedule
      (decaying to 0 at --steps), micro batch 8 without the example's 2 accumulation steps (half the CPU time).
lstm: a 2-layer byte-level LSTM language model (embedding 64, hidden 256) on this repository's README.md, AdamW
      lr 3e-3 (warmup 20 steps, then constant), micro batch 16, clipping 1.0.
Per seed (the seed sets the initial weights and the batch order, identically for both precisions) each run records
the training loss averaged over every --every steps and the loss on fixed held-out windows (the text's last 10%) at
the same steps. The table printed (and pasted into benchmarks/RESULTS.md) shows, per step, the fp32 runs' min and
max over the seeds and each 8-bit run, and whether every 8-bit value lies within the fp32 seeds' spread widened by
its own width (within [min - (max - min), max + (max - min)]: the seed-to-seed noise is the yardstick).
"""
import argparse
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "examples", "gpt"))

import dsfast  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402


class LSTMLM(torch.nn.Module):
    def __init__(self, emb=64, hidden=256, layers=2):
        super().__init__()
        self.emb = torch.nn.Embedding(256, emb)
        self.lstm = torch.nn.LSTM(emb, hidden, layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, 256)

    def forward(self, idx, targets):
        out, _ = self.lstm(self.emb(idx))
        logits = self.head(out)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))


def _text(path):
    with open(path, "rb") as f:
        return torch.tensor(list(f.read()), dtype=torch.long)


def _setup(kind, steps):
    """(model factory, data, seq_len, micro batch, optimizer/scheduler config keys)."""
    if kind == "gpt":
        with open(os.path.join(REPO, "examples", "gpt", "ds_config.json")) as f:
            base = json.load(f)
        base["scheduler"]["params"]["total_num_steps"] = steps
        keys = {k: base[k] for k in ("train_micro_batch_size_per_gpu", "optimizer", "scheduler", "gradient_clipping")}
        keys["train_batch_size"] = keys["train_micro_batch_size_per_gpu"]
        return (lambda: GPT(GPTConfig(seq_len=128, d_model=128, n_layer=4, n_head=4)),
                _text(os.path.join(REPO, "examples", "gpt", "data", "founding.txt")), 128, keys)
    if kind == "lstm":
        keys = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16, "gradient_clipping": 1.0,
                "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.999], "weight_decay": 0.01}},
                "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                             "warmup_num_steps": 20, "warmup_type": "linear"}}}
        return LSTMLM, _text(os.path.join(REPO, "README.md")), 96, keys
    raise SystemExit(f"--models: unknown model {kind!r}; choose from gpt, lstm")


def _windows(data, seq_len, starts):
    idx = torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()])
    return idx[:, :-1], idx[:, 1:]


def run(kind, seed, precision, steps, every):
    factory, data, seq_len, keys = _setup(kind, steps)
    split = int(len(data) * 0.9)
    train, held = data[:split], data[split:]
    torch.manual_seed(seed)
    model = factory()
    off = {"device": "cpu"}
    if precision == "int8":
        off["state_precision"] = "int8"
    cfg = {**keys, "steps_per_print": 10 ** 9, "zero_optimization": {"stage": 2, "offload_optimizer": off}}
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    g = torch.Generator().manual_seed(seed)
    micro = keys["train_micro_batch_size_per_gpu"]
    accum = keys["train_batch_size"] // micro
    held_x, held_y = _windows(held, seq_len, torch.arange(0, len(held) - seq_len - 1, seq_len)[:16])
    curve, window = [], []
    for step in range(1, steps + 1):
        for _ in range(accum):
            x, y = _windows(train, seq_len, torch.randint(0, len(train) - seq_len - 1, (micro,), generator=g))
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            window.append(loss.item())
        if step % every == 0:
            engine.eval()
            with torch.no_grad():
                held_loss = engine(held_x, held_y).item()
            engine.train()
            curve.append({"step": step, "train": sum(window) / len(window), "held": held_loss})
            window = []
    return curve


def within(value, lo, hi):
    width = hi - lo
    return lo - width <= value <= hi + width


def table(kind, results, seeds, key):
    lines = [f"{kind}, {key} loss: fp32 seeds {', '.join(map(str, seeds))} (min-max) and 8-bit per seed",
             "| step | fp32 min | fp32 max | " + " | ".join(f"8-bit s{s}" for s in seeds) + " | 8-bit within |",
             "|---:|---:|---:|" + "---:|" * len(seeds) + ":---:|"]
    inside = 0
    for i, point in enumerate(results[("fp32", seeds[0])]):
        fp = [results[("fp32", s)][i][key] for s in seeds]
        q8 = [results[("int8", s)][i][key] for s in seeds]
        ok = all(within(v, min(fp), max(fp)) for v in q8)
        inside += ok
        lines.append(f"| {point['step']} | {min(fp):.4f} | {max(fp):.4f} | " + " | ".join(f"{v:.4f}" for v in q8)
                     + f" | {'yes' if ok else 'no'} |")
    n = len(results[("fp32", seeds[0])])
    lines.append(f"8-bit within the fp32 seeds' spread (widened by its width) at {inside} of {n} points")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gpt,lstm", help="comma-separated: gpt, lstm")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    ap.add_argument("--every", type=int, default=20, help="steps between table rows")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write every curve here")
    args = ap.parse_args()
    if args.steps < args.every or args.every < 1:
        ap.error("--every must be between 1 and --steps")
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    out = {}
    for kind in args.models.split(","):
        results = {}
        for seed in seeds:
            for precision in ("fp32", "int8"):
                t0 = time.time()
                results[(precision, seed)] = run(kind, seed, precision, args.steps, args.every)
                last = results[(precision, seed)][-1]
                print(f"[{kind} seed {seed} {precision}] {time.time() - t0:.0f}s, final train {last['train']:.4f} "
                      f"held {last['held']:.4f}", flush=True)
        for key in ("train", "held"):
            print("\n".join(table(kind, results, seeds, key)) + "\n", flush=True)
        out[kind] = {f"{p}/seed{s}": c for (p, s), c in results.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if not any(math.isnan(pt["train"]) for runs in out.values() for c in runs.values() for pt in c) else 1


if __name__ == "__main__":
    raise SystemExit(main())
