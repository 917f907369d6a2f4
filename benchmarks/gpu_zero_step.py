"""One-rank ZeRO stage 2 on a GPU, with and without offload_optimizer (pinned host masters, CPU Adam writing the
16-bit parameters), on the benchmark GPT in bf16: both must train the same, then their step times are compared.

    python benchmarks/gpu_zero_step.py [--steps 10] [--d_model 512]     (part of benchmarks/gpu_check.sh)
"""
import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "gpt"))


def run(offload, args):
    import dsfast
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=8192, seq_len=256, n_layer=args.n_layer, n_head=8, d_model=args.d_model))
    zero = {"stage": 2}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**9, "bf16": {"enabled": True},
           "gradient_clipping": 1.0, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
    engine, *_ = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    times, losses = [], []
    for i in range(args.steps):
        g = torch.Generator().manual_seed(i)
        x = torch.randint(0, 8192, (8, 257), generator=g).to(engine.device)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = engine(x[:, :-1], x[:, 1:])
        engine.backward(loss)
        engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    params = [p.detach().float().cpu() for p in engine.module.parameters()]
    return times[2:], losses, params, type(engine.optimizer).__name__, engine.memory_breakdown()["total"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--d_model", type=int, default=512)
    p.add_argument("--n_layer", type=int, default=8)
    args = p.parse_args()
    import dsfast
    dsfast.init_distributed(verbose=False)
    base = run(False, args)
    off = run(True, args)
    worst = max(float((a - b).abs().max()) for a, b in zip(base[2], off[2]))
    print(f"losses no offload {base[1][0]:.4f} -> {base[1][-1]:.4f}; offload {off[1][0]:.4f} -> {off[1][-1]:.4f}; "
          f"max param difference {worst:.3e} (bf16 model)")
    mb, mo = statistics.median(base[0]), statistics.median(off[0])
    print(f"=== summary\nstage 2 bf16 ({base[3]}): {1000 * mb:.1f} ms/step, memory {base[4]}\n"
          f"stage 2 + offload ({off[3]}, pinned): {1000 * mo:.1f} ms/step (x{mo / mb:.2f}), memory {off[4]}")
    if worst > 5e-2:
        raise SystemExit("offload and device steps disagree")


if __name__ == "__main__":
    main()
