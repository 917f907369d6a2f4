"""engine.monitor: the config's "tensorboard", "csv_monitor" and "wandb" sections (DeepSpeed's MonitorMaster).

Rank 0 writes; events are (name, value, step) tuples, as DeepSpeed's: `engine.monitor.write_events([...])` from
the program, and at every optimizer step the engine's own, keyed by samples seen:
  Train/Samples/train_loss   the mean loss of rank 0's micro-batches of the step (DeepSpeed logs it only in
                             its pipeline engine)
  Train/Samples/lr           the first param group's learning rate
  Train/Samples/loss_scale   fp16 only
Files go to <output_path>/<job_name>/ (output_path "" = the working directory), as DeepSpeed puts them.
A section that is enabled but whose package is missing (tensorboard, wandb) is an error at initialize().
"""
import csv
import importlib
import os

from .progress import LossMean


def _require(module, section, package):
    """Import `module` for the config's `section`, or say which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f'the config\'s "{section}" section is enabled, but the {package} package is not '
                          f'installed ({e}); pip install {package}, or set "enabled": false') from None


class _Csv:
    """One <name with '/' and ' ' as '_'>.csv per event name: a 'step,<last part of the name>' header, then rows."""

    def __init__(self, cfg):
        self.dir = os.path.join(cfg.output_path, cfg.job_name)
        os.makedirs(self.dir, exist_ok=True)
        self._started = set()

    def write(self, events):
        for name, value, step in events:
            file = name.replace("/", "_").replace(" ", "_")
            with open(os.path.join(self.dir, file + ".csv"), "a", newline="") as f:
                w = csv.writer(f)
                if file not in self._started:
                    self._started.add(file)
                    w.writerow(["step", name.rsplit("/", 1)[-1]])
                w.writerow([step, value])

    def close(self):
        pass


class _Tensorboard:
    def __init__(self, cfg):
        SummaryWriter = _require("torch.utils.tensorboard", "tensorboard", "tensorboard").SummaryWriter
        log_dir = os.path.join(cfg.output_path, cfg.job_name)
        os.makedirs(log_dir, exist_ok=True)
        self.writer = SummaryWriter(log_dir=log_dir)

    def write(self, events):
        for name, value, step in events:
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class _Wandb:
    def __init__(self, cfg):
        self.wandb = wandb = _require("wandb", "wandb", "wandb")
        wandb.init(project=cfg.project, group=cfg.group, entity=cfg.team)

    def write(self, events):
        for name, value, step in events:
            self.wandb.log({name: value}, step=step)

    def close(self):
        pass


_WRITERS = (("tensorboard", _Tensorboard), ("csv_monitor", _Csv), ("wandb", _Wandb))


class Monitor:
    def __init__(self, config, rank):
        enabled = [(make, getattr(config, name)) for name, make in _WRITERS if getattr(config, name).enabled]
        self.enabled = bool(enabled)            # as DeepSpeed: on every rank alike
        self.writers = [make(cfg) for make, cfg in enabled] if rank == 0 else []
        self._loss = LossMean()

    def write_events(self, event_list):
        """[(name, value, step), ...] to every enabled writer (rank 0 only; a no-op elsewhere)."""
        events = [(str(n), float(v), int(s)) for n, v, s in event_list]
        for w in self.writers:
            w.write(events)

    def record_loss(self, loss):
        if self.writers:
            self._loss.add(loss)

    def on_step(self, samples, lrs, loss_scale, swapped=None):
        """The engine's events of one optimizer step (swapped: the NVMe swap's bytes read and written by it)."""
        if not self.writers:
            return
        events = []
        loss = self._loss.take()
        if loss is not None:
            events.append(("Train/Samples/train_loss", loss, samples))
        if lrs:
            events.append(("Train/Samples/lr", lrs[0], samples))
        if loss_scale is not None:
            events.append(("Train/Samples/loss_scale", loss_scale, samples))
        if swapped is not None:
            events.append(("Train/Samples/nvme_read_bytes", swapped[0], samples))
            events.append(("Train/Samples/nvme_written_bytes", swapped[1], samples))
        self.write_events(events)

    def close(self):
        for w in self.writers:
            w.close()
