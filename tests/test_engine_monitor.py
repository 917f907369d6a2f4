"""engine.monitor (the config's tensorboard / csv_monitor / wandb sections): the engine's per-step events keyed by
samples, the program's own write_events, rank 0 only, and a clear error when an enabled writer's package is
missing. tensorboard and wandb are replaced by recording stand-ins (neither is a dependency)."""
import csv
import sys
import types

import pytest
import torch

import dsfast
from dsfast.config import load_config
from dsfast.engine.monitor import Monitor


def _engine(**extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 1))
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}, **extra}
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def _train(engine, steps):
    losses = []
    for _ in range(steps * engine.gradient_accumulation_steps()):
        loss = engine(torch.randn(2, 6)).square().mean()
        losses.append(loss.item())
        engine.backward(loss)
        engine.step()
    return losses


def test_csv_monitor_writes_loss_lr_and_loss_scale_per_step(tmp_path):
    e = _engine(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "run1"},
                fp16={"enabled": True, "initial_scale_power": 4})
    losses = _train(e, 3)
    e.monitor.write_events([("Eval/accuracy", 0.5, 12)])
    d = tmp_path / "run1"
    loss_rows = _rows(d / "Train_Samples_train_loss.csv")
    assert loss_rows[0] == ["step", "train_loss"] and [int(r[0]) for r in loss_rows[1:]] == [4, 8, 12]
    for (_, value), pair in zip(loss_rows[1:], zip(losses[::2], losses[1::2])):
        assert float(value) == pytest.approx(sum(pair) / 2, rel=1e-3)    # the step's micro-batches' mean (fp16)
    assert [r[1] for r in _rows(d / "Train_Samples_lr.csv")[1:]] == ["0.01"] * 3
    assert _rows(d / "Train_Samples_loss_scale.csv")[0] == ["step", "loss_scale"]
    assert _rows(d / "Eval_accuracy.csv") == [["step", "accuracy"], ["12", "0.5"]]


def test_no_loss_scale_events_without_fp16_and_none_on_other_ranks(tmp_path):
    e = _engine(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "j"})
    _train(e, 1)
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == ["Train_Samples_lr.csv",
                                                                  "Train_Samples_train_loss.csv"]
    cfg = load_config({"train_batch_size": 2, "csv_monitor": {"enabled": True, "output_path": str(tmp_path / "r1")}})
    other = Monitor(cfg, rank=1)
    other.write_events([("x", 1.0, 1)])
    assert other.enabled and not other.writers and not (tmp_path / "r1").exists()


class _Recorder:
    def __init__(self):
        self.calls = []


def test_tensorboard_writes_scalars_to_output_path_job_name(tmp_path, monkeypatch):
    rec = _Recorder()

    class SummaryWriter:
        def __init__(self, log_dir):
            rec.calls.append(("dir", log_dir))

        def add_scalar(self, name, value, step):
            rec.calls.append((name, value, step))

        def flush(self):
            pass

        def close(self):
            pass
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter))
    e = _engine(tensorboard={"enabled": True, "output_path": str(tmp_path), "job_name": "tb"})
    _train(e, 2)
    assert rec.calls[0] == ("dir", str(tmp_path / "tb"))
    assert [(n, s) for n, _, s in rec.calls[1:]] == [("Train/Samples/train_loss", 4), ("Train/Samples/lr", 4),
                                                     ("Train/Samples/train_loss", 8), ("Train/Samples/lr", 8)]


def test_wandb_logs_each_event(monkeypatch):
    rec = _Recorder()
    fake = types.SimpleNamespace(init=lambda **kw: rec.calls.append(("init", kw)),
                                 log=lambda data, step=None: rec.calls.append((data, step)))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    e = _engine(wandb={"enabled": True, "project": "p", "team": "t"})
    _train(e, 1)
    assert rec.calls[0] == ("init", {"project": "p", "group": None, "entity": "t"})
    assert [list(d)[0] for d, _ in rec.calls[1:]] == ["Train/Samples/train_loss", "Train/Samples/lr"]


def test_an_enabled_writer_without_its_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)     # as if tensorboard were not installed
    with pytest.raises(ImportError, match=r'"tensorboard" section is enabled, but the tensorboard package is not '
                                          r'installed.*pip install tensorboard, or set "enabled": false'):
        _engine(tensorboard={"enabled": True})
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r'"wandb" section is enabled.*pip install wandb'):
        _engine(wandb={"enabled": True})
