"""initialize's inputs: config sources and errors, add_config_arguments, the training-data loader."""
import argparse
import json

import pytest
import torch

import dsfast
from dsfast.config import DsConfigError
from dsfast.engine.data import build_dataloader


def model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


def init(**kw):
    m = model()
    return dsfast.initialize(model=m, model_parameters=m.parameters(), dist_init_required=False, **kw)


@pytest.mark.parametrize("cfg,match", [
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2},
     r"train_batch_size=10, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2, detected world size=1"),
    ({"train_batch_size": 8, "zero_optimization": {"stage": 4}}, "less than or equal to 3"),
    ({"train_batch_size": 8, "optimizer": {"type": "Adamm"}}, "did you mean 'adam'"),
    ({"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}}, "mutually exclusive"),
    ({"train_batch_size": 8, "gradient_clipping": -1}, "gradient_clipping"),
    ({"train_batch_size": 8, "fp16": {"enabled": True, "loss_scale_windw": 10}}, "did you mean 'loss_scale_window'"),
])
def test_config_errors_surface_from_initialize(cfg, match):
    with pytest.raises(DsConfigError, match=match):
        init(config=cfg)


def test_config_sources(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 2, "optimizer": {"type": "sgd", "params": {"lr": 0.1}}}))
    args = argparse.Namespace(deepspeed_config=str(path))
    for kw in ({"args": args}, {"config": str(path)}, {"config": json.loads(path.read_text())},
               {"config_params": json.loads(path.read_text())}):
        engine, opt, _, _ = init(**kw)
        assert engine.train_batch_size() == 2 and opt.param_groups[0]["lr"] == 0.1
    with pytest.raises(DsConfigError, match="two ds_configs given at once"):
        init(args=args, config=str(path))
    with pytest.raises(DsConfigError, match="no ds_config given"):
        init()


def test_bad_model_and_stray_parameters_are_clear_errors():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        dsfast.initialize(model=lambda x: x, config={"train_batch_size": 1}, dist_init_required=False)
    other = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="not parameters of `model`"):
        dsfast.initialize(model=model(), model_parameters=other.parameters(), config={"train_batch_size": 1},
                          dist_init_required=False)


def test_add_config_arguments_with_scripts_own_local_rank():
    # the second seed's pattern: --local_rank declared first, parse_known_args, then our flags
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--isDeepspeed", action="store_true")
    args, _ = parser.parse_known_args(["--isDeepspeed", "--deepspeed_config", "c.json", "--local_rank=1"])
    parser = dsfast.add_config_arguments(parser)
    args = parser.parse_args(["--isDeepspeed", "--deepspeed", "--deepspeed_config", "c.json", "--local_rank=1"])
    assert (args.local_rank, args.deepspeed, args.deepspeed_config) == (1, True, "c.json")
    # aliases fill the same fields; a second call and a later --local_rank do not conflict
    parser = dsfast.add_config_arguments(dsfast.add_config_arguments(argparse.ArgumentParser()))
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args(["--dsfast", "--dsfast_config", "d.json", "--local_rank", "0"])
    assert (args.deepspeed, args.deepspeed_config, args.local_rank) == (True, "d.json", 0)
    assert parser.parse_args([]).deepspeed_config is None


class Indexed(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.tensor([i])


def _epoch(loader):
    return [int(i) for b in loader for i in b.flatten()]


def test_loader_shards_ranks_pads_uneven_and_reshuffles_each_epoch():
    loaders = [build_dataloader(Indexed(10), 2, world_size=3, rank=r) for r in range(3)]
    epoch0 = [_epoch(lo) for lo in loaders]
    assert [len(e) for e in epoch0] == [4, 4, 4]       # ceil(10 / 3) each: 2 samples repeated as padding
    assert sorted(set(sum(epoch0, []))) == list(range(10))
    assert [len(lo) for lo in loaders] == [2, 2, 2]     # same number of micro-batches on every rank
    epoch1 = [_epoch(lo) for lo in loaders]
    assert epoch1 != epoch0 and sorted(set(sum(epoch1, []))) == list(range(10))


def test_loader_drop_last_drops_the_short_final_micro_batch():
    keep = build_dataloader(Indexed(10), 4, world_size=2, rank=0)
    drop = build_dataloader(Indexed(10), 4, world_size=2, rank=0, drop_last=True)
    assert [len(b) for b in keep] == [4, 1] and [len(b) for b in drop] == [4]


def test_initialize_builds_loader_from_training_data_with_collate_fn():
    engine, _, loader, _ = init(config={"train_batch_size": 3, "dataloader_drop_last": True},
                                training_data=Indexed(10), collate_fn=lambda items: torch.cat(items) * 10)
    batches = list(loader)
    assert [len(b) for b in batches] == [3, 3, 3] and all(int(v) % 10 == 0 for b in batches for v in b)
    assert isinstance(loader.sampler, torch.utils.data.DistributedSampler)
    with pytest.raises(TypeError, match="IterableDataset"):
        init(config={"train_batch_size": 3}, training_data=torch.utils.data.IterableDataset())


@pytest.mark.parametrize("opt_cfg,cls_name,adamw", [
    ({"type": "Adam", "params": {"lr": 0.1}}, "CPUAdam", True),   # DeepSpeed: Adam is AdamW unless adam_w_mode false
    ({"type": "adam", "params": {"adam_w_mode": False}}, "CPUAdam", False),
    ({"type": "ADAMW", "params": {"weight_decay": 0.1}}, "CPUAdam", True),
    ({"type": "AdamW", "params": {"torch_adam": True}}, "AdamW", None),
    ({"type": "Adam", "params": {"torch_adam": True, "adam_w_mode": False}}, "Adam", None),
    ({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": True}}, "CPUSGD", None),
])
def test_config_optimizer_types_map_to_dsfast_cpu_optimizers(opt_cfg, cls_name, adamw):
    _, opt, _, _ = init(config={"train_batch_size": 1, "optimizer": opt_cfg})
    assert type(opt).__name__ == cls_name
    if adamw is not None:
        assert opt.param_groups[0]["adamw_mode"] is adamw
    for key, value in opt_cfg["params"].items():
        if key in opt.param_groups[0]:
            assert opt.param_groups[0][key] == value


def test_gpu_optimizer_mapping_picks_fused_kernels():
    from dsfast.engine.optimizer_factory import _adam_class, _sgd_class
    from dsfast.optim import FusedAdam, FusedSGD
    assert _adam_class("cuda", False, False) == (FusedAdam, {"adam_w_mode": False})
    assert _sgd_class("cuda") is FusedSGD


def test_initialize_takes_deepspeed_s_distributed_port_and_refuses_mesh_param(monkeypatch):
    import dsfast.comm
    seen = {}
    monkeypatch.setattr(dsfast.comm, "init_distributed", lambda **kw: seen.update(kw))
    m = model()
    dsfast.initialize(model=m, model_parameters=m.parameters(), config={"train_batch_size": 1},
                      distributed_port=29613)
    assert seen["distributed_port"] == 29613       # the rendezvous port when MASTER_PORT is unset
    with pytest.raises(NotImplementedError, match=r"mesh_param=\(2, 1\).*not supported"):
        init(config={"train_batch_size": 1}, mesh_param=(2, 1))
