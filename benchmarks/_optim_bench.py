"""Timing plumbing for benchmarks/cpu_optim.py: the in-place bandwidth ceiling, interleaved
(A B A B ...) sampling with the ceiling measured right beside every sample, medians, tables."""
import statistics
import time

import torch

from dsfast.zero.planning.host_figures import CEILING_BYTES, Ceiling  # noqa: F401  (the one ceiling; re-exported)


def staggered(*tensors):
    """Copies of the tensors, the k-th at k x (8 KB + 64 B) into a buffer of its own. Arrays of one power-of-two size
    allocated back to back sit size + 4 KB apart, and four streams so aligned run the Adam kernels up to 1.8x slower
    on this machine (torch's too; RESULTS: "The alignment cliff"): a row measures its kernel, not that layout."""
    out = []
    for k, t in enumerate(tensors):
        pad = k * (8192 + 64) // t.element_size()
        copy = torch.empty(t.numel() + pad, dtype=t.dtype)[pad:].view(t.shape)
        copy.copy_(t)
        out.append(copy)
    return out


def run_interleaved(impls, rounds, ceiling, warmup=1, slow_keep=2):
    """impls: {name: step_fn}. Each round visits every impl (rotating the order); each sample
    is preceded by a ceiling sample. An impl over 4x slower than the fastest stops after
    `slow_keep` samples (it is far from the race; its number is still printed).
    Returns {name: [(seconds, ceiling_GBps), ...]}."""
    names = list(impls)
    for name in names:
        for _ in range(warmup):
            impls[name]()
    samples = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            done = [statistics.median(t for t, _ in v) for v in samples.values() if v]
            mine = samples[name]
            if len(mine) >= slow_keep and statistics.median(t for t, _ in mine) > 4 * min(done):
                continue
            gbps = ceiling.sample()
            t0 = time.perf_counter()
            impls[name]()
            samples[name].append((time.perf_counter() - t0, gbps))
    return samples


def summarise(samples, nparams, bytes_per_param, ours):
    """Per impl: median ms, Mparams/s, GB/s, median fraction of the ceiling measured beside each
    sample, and ours' speedup over it (median of per-round paired ratios)."""
    rows = {}
    ours_t = [t for t, _ in samples[ours]]
    for name, ss in samples.items():
        ts = [t for t, _ in ss]
        med = statistics.median(ts)
        fracs = [bytes_per_param * nparams / t / 1e9 / g for t, g in ss]
        paired = [t / o for t, o in zip(ts, ours_t)]
        rows[name] = dict(ms=med * 1e3, mparams=nparams / med / 1e6, gbps=bytes_per_param * nparams / med / 1e9,
                          frac=statistics.median(fracs), speedup=statistics.median(paired),
                          ceiling=statistics.median(g for _, g in ss), n=len(ss))
    return rows


def print_table(title, note, rows, ours):
    print(f"\n== {title} ==")
    print(f"   {note}")
    print(f"   {'implementation':<34}{'ms/step':>9}{'Mparam/s':>10}{'GB/s':>7}{'ceil GB/s':>10}{'of ceil':>8}"
          f"{'ours is':>9}")
    for name, r in rows.items():
        mark = "  <- ours" if name == ours else ""
        speed = "" if name == ours else f"{r['speedup']:.2f}x"
        print(f"   {name:<34}{r['ms']:>9.1f}{r['mparams']:>10.0f}{r['gbps']:>7.1f}{r['ceiling']:>10.1f}"
              f"{r['frac']:>8.2f}{speed:>9}{mark}")
