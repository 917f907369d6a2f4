"""One rank at every ZeRO stage, with and without offload, on a GPU: each must train as stage 0 does, then their
step times are compared (the benchmark GPT in bf16).

    stage 0 | 1 | 1 + offload_optimizer | 2 | 2 + offload_optimizer | 3 | 3 + offload_optimizer + offload_param

Offload pins the host masters and has the CPU Adam write the 16-bit parameters into pinned host copies, which go
back to the device after the step; stage 3 copies gradient buckets to the host as their reduction completes.
These are the copies, streams and pinned buffers that only a GPU runs for real (on CPU ranks the test placement
DSFAST_TEST_PLACEMENT=distinct-host runs the same code on distinct CPU buffers).

    python benchmarks/gpu_zero_step.py [--steps 10] [--d_model 512]     (part of benchmarks/gpu_check.sh)
    python benchmarks/gpu_zero_step.py --steps 3 --d_model 64 --n_layer 2 --seq_len 32     (a CPU dry run)
"""
import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "gpt"))

RUNS = [("stage 0", 0, False, False), ("stage 1", 1, False, False), ("stage 1 + offload", 1, True, False),
        ("stage 2", 2, False, False), ("stage 2 + offload", 2, True, False), ("stage 3", 3, False, False),
        ("stage 3 + both offloads", 3, True, True)]
TOLERANCE = 5e-2   # bf16 parameters: stages reduce 16-bit gradients where stage 0 accumulates fp32


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(stage, offload, offload_param, args):
    import dsfast
    from dsfast.utils import safe_get_full_fp32_param
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=args.vocab, seq_len=args.seq_len, n_layer=args.n_layer, n_head=8,
                          d_model=args.d_model))
    zero = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**9, "bf16": {"enabled": True},
           "gradient_clipping": 1.0, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
    engine, *_ = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    times, losses = [], []
    for i in range(args.steps):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, args.vocab, (8, args.seq_len + 1), generator=g).to(engine.device)
        sync(engine.device)
        t0 = time.perf_counter()
        loss = engine(x[:, :-1], x[:, 1:])
        engine.backward(loss)
        engine.step()
        sync(engine.device)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    params = [safe_get_full_fp32_param(p).detach().float().cpu() for p in engine.module.parameters()]
    memory = engine.memory_breakdown()["total"]
    engine.destroy()
    return times[min(2, len(times) - 1):], losses, params, type(engine.optimizer).__name__, memory


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--d_model", type=int, default=512)
    p.add_argument("--n_layer", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    args = p.parse_args()
    import dsfast
    dsfast.init_distributed(verbose=False)
    results = [(name, run(stage, off, off_param, args)) for name, stage, off, off_param in RUNS]
    base_name, base = results[0]
    print("=== summary")
    worst_all = 0.0
    for name, r in results:
        worst = max(float((a - b).abs().max()) for a, b in zip(base[2], r[2]))
        worst_all = max(worst_all, worst)
        ms = 1000 * statistics.median(r[0])
        print(f"{name:<24} {r[3]:<10} {ms:8.1f} ms/step (x{ms / (1000 * statistics.median(base[0])):.2f} of "
              f"{base_name}), loss {r[1][0]:.4f} -> {r[1][-1]:.4f}, max param difference {worst:.2e}, "
              f"memory {r[4]}")
    if worst_all > TOLERANCE:
        raise SystemExit(f"a stage trained differently from stage 0 (max parameter difference {worst_all:.3e} > "
                         f"{TOLERANCE})")


if __name__ == "__main__":
    main()
