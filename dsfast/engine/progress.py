"""Progress lines: every `steps_per_print` optimizer steps, rank 0 prints one line; nothing otherwise.

    [dsfast] step 20 | loss 2.3172 | loss scale 1024 | lr 9.00e-04 | 812.3 samples/s | skipped 1
The loss is the mean of this rank's micro-batch losses since the previous line, kept as a device tensor so
that logging costs one host sync per printed line, not one per step.
"""
import time

import torch


class LossMean:
    """The mean of the losses added since the last take() (kept as a tensor: no sync per micro-batch)."""

    def __init__(self):
        self._sum, self._count = None, 0

    def add(self, loss):
        value = loss.detach().float().reshape(-1).mean() if loss.numel() != 1 else loss.detach().float().reshape(())
        self._sum = value if self._sum is None else self._sum + value
        self._count += 1

    def take(self):
        """The mean as a float (None if nothing was added), and start again."""
        mean = None if self._sum is None else float(self._sum) / self._count
        self._sum, self._count = None, 0
        return mean


class Progress:
    def __init__(self, steps_per_print, rank, wall_clock_breakdown=False, device=None):
        self.every = int(steps_per_print or 0)
        self.enabled = rank == 0 and self.every > 0
        self.breakdown = wall_clock_breakdown and rank == 0
        self.device = device
        self._loss = LossMean()
        self._t0 = time.perf_counter()
        self._samples0 = 0
        self._phase = {}
        self._phase_start = {}

    def record_loss(self, loss):
        if not self.enabled:
            return
        self._loss.add(loss)

    # wall_clock_breakdown: time of forward / backward / step, summed between progress lines
    def start(self, phase):
        if self.breakdown:
            self._sync()
            self._phase_start[phase] = time.perf_counter()

    def stop(self, phase):
        if self.breakdown and phase in self._phase_start:
            self._sync()
            self._phase[phase] = self._phase.get(phase, 0.0) + time.perf_counter() - self._phase_start.pop(phase)

    def _sync(self):
        if self.device is not None and torch.device(self.device).type == "cuda":
            torch.cuda.synchronize(self.device)

    _swapped = (0, 0)

    def on_step(self, step, samples, lrs, loss_scale, skipped, swapped=None):
        """swapped: (bytes read, bytes written) by the NVMe swap in this step (None without one)."""
        if swapped is not None:
            self._swapped = tuple(a + b for a, b in zip(self._swapped, swapped))
        if not self.enabled or step % self.every:
            return
        now = time.perf_counter()
        rate = (samples - self._samples0) / max(now - self._t0, 1e-9)
        parts = [f"[dsfast] step {step}"]
        loss = self._loss.take()
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        if loss_scale is not None:
            parts.append(f"loss scale {loss_scale:g}")
        parts.append("lr " + ",".join(f"{lr:.2e}" for lr in lrs))
        parts.append(f"{rate:.1f} samples/s")
        parts.append(f"skipped {skipped}")
        if swapped is not None:   # the wear on the disk: per step, averaged since the previous line
            r, w = (v / self.every / 2**20 for v in self._swapped)
            parts.append(f"nvme read {r:.1f} MiB written {w:.1f} MiB per step")
            self._swapped = (0, 0)
        if self.breakdown and self._phase:
            parts.append(" ".join(f"{k} {1000 * v / self.every:.1f}ms" for k, v in self._phase.items()))
            self._phase.clear()
        print(" | ".join(parts), flush=True)
        self._t0, self._samples0 = now, samples
