"""Checkpoints in one process: tags, unsafe state, corrupted files, resharding over SliceRecords, consolidation,
module-only / weights-only loads, asynchronous saves. The multi-rank behaviour is in tests/distributed/."""
import collections
import json
import os
import warnings

import pytest
import torch

import dsfast
from dsfast.checkpoint import (CheckpointCorruptError, CheckpointError, Layout, SliceRecord, UnsafeStateError,
                               consolidate, manifest, shards)
from dsfast.checkpoint.safetensors_io import SafeTensorsFile, write_file
from dsfast.checkpoint.tags import normalize_tag


def build_model(frozen=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4))
    if frozen:
        model[1].requires_grad_(False)
    return model


def config(precision="fp32", **ckpt):
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}}}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if ckpt:
        cfg["checkpoint"] = ckpt
    return cfg


def engine_for(precision="fp32", frozen=False, **ckpt):
    engine, _, _, _ = dsfast.initialize(model=build_model(frozen), config=config(precision, **ckpt),
                                        dist_init_required=False)
    return engine


def train(engine, first, last):
    for i in range(first, last):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()


def masters(engine):
    return [dsfast.utils.safe_get_full_fp32_param(p) for p in engine.module.parameters() if p.requires_grad]


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


# ---- tags ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tag,text", [(None, "global_step7"), (2.3141, "2.3141"), (12, "12"), ("run-a_1", "run-a_1"),
                                      (-1e-05, "-1e-05")])
def test_tags_that_print_as_safe_folder_names(tag, text):
    assert normalize_tag(tag, 7) == text


@pytest.mark.parametrize("tag,why", [("a/b", "'/'"), ("..", "'..'"), ("x/../y", "'..'"), ("", "empty"),
                                     ("x" * 201, "201 bytes"), ("latest", "points at the newest"),
                                     (".hidden", "starts with '.'"), (float("nan"), "not finite"),
                                     (True, "str, int or float"), ("a\nb", "control")])
def test_unsafe_tags_are_refused_with_the_reason(tag, why, tmp_path):
    with pytest.raises(CheckpointError, match="tag") as info:
        normalize_tag(tag)
    assert why in str(info.value)
    engine = engine_for()
    with pytest.raises(CheckpointError):
        engine.save_checkpoint(str(tmp_path), tag)
    assert os.listdir(tmp_path) == []


# ---- safety -------------------------------------------------------------------------------------------------
class Opaque:
    pass


def test_client_state_that_would_need_pickling_is_refused_at_save_naming_the_key(tmp_path):
    engine = engine_for()
    with pytest.raises(UnsafeStateError, match=r"client_state\['a'\]\['b'\]\[1\] is a .*Opaque"):
        engine.save_checkpoint(str(tmp_path), "t", client_state={"a": {"b": [1, Opaque()]}})
    with pytest.raises(UnsafeStateError, match=r"client_state has the key 3"):
        engine.save_checkpoint(str(tmp_path), "t", client_sd={3: "x"})
    assert os.listdir(tmp_path) == []


def test_client_state_round_trips_tensors_tuples_dtypes_and_specials(tmp_path):
    engine = engine_for()
    sd = {"step": 5, "t": torch.arange(3.0), "pair": (1, "a"), "dtype": torch.bfloat16, "inf": float("inf"),
          "nested": {"l": [None, True, torch.ones(2, dtype=torch.int64)]}}
    engine.save_checkpoint(str(tmp_path), "t", client_state=sd)
    _, got = engine_for().load_checkpoint(str(tmp_path))
    assert got["step"] == 5 and got["pair"] == (1, "a") and got["dtype"] is torch.bfloat16
    assert torch.equal(got["t"], sd["t"]) and got["inf"] == float("inf")
    assert got["nested"]["l"][:2] == [None, True] and torch.equal(got["nested"]["l"][2], sd["nested"]["l"][2])


def _saved(tmp_path, precision="fp32"):
    engine = engine_for(precision)
    train(engine, 0, 3)
    engine.save_checkpoint(str(tmp_path), "t")
    return engine, tmp_path / "t"


@pytest.mark.parametrize("victim", ["optim_rank00000.safetensors", "model.safetensors", "engine_state.json"])
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_truncated_or_corrupted_file_is_named_and_nothing_is_loaded(tmp_path, victim, damage):
    _, folder = _saved(tmp_path)
    path = folder / victim
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:len(data) // 2]
    else:
        data[len(data) - 3] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = engine_for()
    before = masters(fresh), [p.detach().clone() for p in fresh.module.parameters()], fresh.global_steps
    with pytest.raises(CheckpointCorruptError, match=victim):
        fresh.load_checkpoint(str(tmp_path))
    assert same(masters(fresh), before[0]) and fresh.global_steps == before[2]
    assert same([p.detach() for p in fresh.module.parameters()], before[1])


def test_a_broken_manifest_is_named(tmp_path):
    _, folder = _saved(tmp_path)
    (folder / "manifest.json").write_text('{"format": "dsfast-chec')
    with pytest.raises(CheckpointCorruptError, match="manifest.json.*not valid JSON"):
        engine_for().load_checkpoint(str(tmp_path))


def test_safetensors_reader_checks_offsets_without_a_manifest(tmp_path):
    path = tmp_path / "x.safetensors"
    write_file(str(path), {"a": torch.arange(10.0), "b": torch.ones(2, 2, dtype=torch.bfloat16)})
    f = SafeTensorsFile(str(path))
    assert torch.equal(f.get("a"), torch.arange(10.0)) and f.get("b").dtype == torch.bfloat16
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointCorruptError, match=r"x\.safetensors.*truncated"):
        SafeTensorsFile(str(path))


def test_a_missing_checkpoint_returns_none_none_with_a_warning(tmp_path):
    engine = engine_for()
    with pytest.warns(UserWarning, match="no `latest` file"):
        assert engine.load_checkpoint(str(tmp_path)) == (None, None)
    with pytest.warns(UserWarning, match="does not exist"):
        assert engine.load_checkpoint(str(tmp_path), "nope") == (None, None)


# ---- load options -------------------------------------------------------------------------------------------
def test_load_module_only_and_without_optimizer_states(tmp_path):
    trained, _ = _saved(tmp_path, "fp16")
    only = engine_for("fp16")
    only.load_checkpoint(str(tmp_path), load_module_only=True)
    assert only.global_steps == 0 and len(only.optimizer.state) == 0
    for a, b in zip(only.module.parameters(), trained.module.parameters()):
        assert torch.equal(a, b)
    assert same(masters(only), [p.detach().float() for p in trained.module.parameters()])  # refreshed masters
    weights = engine_for("fp16")
    weights.load_checkpoint(str(tmp_path), load_optimizer_states=False, load_lr_scheduler_states=False)
    assert same(masters(weights), masters(trained)) and len(weights.optimizer.state) == 0
    assert weights.global_steps == 3 and weights.lr_scheduler.last_batch_iteration != 2


# ---- resharding over SliceRecords ---------------------------------------------------------------------------
class FakeOptimizer:
    def __init__(self):
        self.state = collections.defaultdict(dict)


def zero_like_layouts(shapes, world, names):
    """What ZeRO 1/2 hands the checkpoint: all params flattened into one buffer, split into `world` equal flat
    shards (the last padded), one SliceRecord per (param, shard) overlap."""
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    total = sum(sizes)
    part = -(-total // world)
    layouts = []
    for r in range(world):
        lo, hi = r * part, min((r + 1) * part, total)
        shard = torch.nn.Parameter(torch.zeros(part))
        records, offset = [], 0
        for name, shape, n in zip(names, shapes, sizes):
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b:
                records.append(SliceRecord(name, tuple(shape), a - offset, b - offset, shard, a - lo))
            offset += n
        layouts.append(Layout(records, replicated=False, stage=2, world_size=world))
    return layouts


def per_param_layout(shapes, names):
    """Stage 0: one tensor per parameter, the whole of it."""
    return Layout([SliceRecord(n, tuple(s), 0, int(torch.Size(s).numel()), torch.nn.Parameter(torch.zeros(s)), 0)
                   for n, s in zip(names, shapes)], replicated=True, stage=0, world_size=1)


def _write_simulated(tmp_path, layouts, full, step=7.0):
    reports = []
    for r, layout in enumerate(layouts):
        opt = FakeOptimizer()
        for rec in layout.records:      # fill this rank's shards from the full tensors
            n = rec.stop - rec.start
            for key, src in full.items():
                t = rec.opt_param if key == "master" else opt.state[rec.opt_param].setdefault(
                    key, torch.zeros_like(rec.opt_param))
                t.data.view(-1)[rec.opt_offset:rec.opt_offset + n] = src[rec.name].reshape(-1)[rec.start:rec.stop]
            opt.state[rec.opt_param]["step"] = torch.tensor(step)
        tensors, slices = shards.collect(layout, opt, manifest.optim_file(r))
        files = {manifest.optim_file(r): write_file(str(tmp_path / manifest.optim_file(r)), tensors)}
        reports.append({"files": files, "slices": slices})
    return manifest.build("sim", {"world_size": len(layouts), "stage": 2, "replicated": False}, "fp32", reports, {})


@pytest.mark.parametrize("saved_world,load_world", [(2, 1), (2, 3), (2, 4), (4, 2), (3, "stage0"), (1, 2)])
def test_resharding_reads_any_world_size_from_slices(tmp_path, saved_world, load_world):
    names = ["a.weight", "a.bias", "b.weight", "c"]
    shapes = [(5, 3), (5,), (4, 5), (7,)]
    g = torch.Generator().manual_seed(0)
    full = {key: {n: torch.randn(s, generator=g) for n, s in zip(names, shapes)}
            for key in ("master", "exp_avg", "exp_avg_sq")}
    m = _write_simulated(tmp_path, zero_like_layouts(shapes, saved_world, names), full)
    files = {}

    def open_file(name):
        files.setdefault(name, SafeTensorsFile(str(tmp_path / name), m["files"][name]))
        return files[name]

    targets = [per_param_layout(shapes, names)] if load_world == "stage0" else \
        zero_like_layouts(shapes, load_world, names)
    for layout in targets:
        opt = FakeOptimizer()             # a fresh optimizer: no state yet, created by the load
        shards.apply(layout, opt, m["params"], open_file)
        for rec in layout.records:
            n = rec.stop - rec.start
            for key in ("master", "exp_avg", "exp_avg_sq"):
                t = rec.opt_param if key == "master" else opt.state[rec.opt_param][key]
                want = full[key][rec.name].reshape(-1)[rec.start:rec.stop]
                assert torch.equal(t.detach().view(-1)[rec.opt_offset:rec.opt_offset + n], want), (key, rec.name)
            assert float(opt.state[rec.opt_param]["step"]) == 7.0


def test_resharding_errors_name_the_parameter(tmp_path):
    names, shapes = ["w"], [(6,)]
    full = {"master": {"w": torch.arange(6.0)}}
    m = _write_simulated(tmp_path, zero_like_layouts(shapes, 2, names), full)
    m["params"]["w"]["slices"].pop()        # a manifest missing one rank's slice
    open_file = lambda name: SafeTensorsFile(str(tmp_path / name), m["files"][name])  # noqa: E731
    with pytest.raises(CheckpointError, match=r"covers 3 of the 6 elements .* parameter 'w'"):
        shards.apply(per_param_layout(shapes, names), FakeOptimizer(), m["params"], open_file)
    with pytest.raises(CheckpointError, match=r"'w' has shape \(2, 3\) here but \(6,\)"):
        shards.apply(per_param_layout([(2, 3)], names), FakeOptimizer(), m["params"], open_file)
    with pytest.raises(CheckpointError, match="no master weights for parameter 'v'"):
        shards.apply(per_param_layout(shapes, ["v"]), FakeOptimizer(), m["params"], open_file)


# ---- consolidation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_consolidate_equals_the_trained_fp32_weights_and_loads_into_the_plain_model(tmp_path, precision):
    engine = engine_for(precision, frozen=True)
    train(engine, 0, 3)
    engine.save_checkpoint(str(tmp_path), "t")
    sd = consolidate(str(tmp_path))
    names = {id(p): n for n, p in engine.module.named_parameters()}
    trained = [p for p in engine.module.parameters() if p.requires_grad]
    assert trained and all(torch.equal(sd[names[id(p)]], dsfast.utils.safe_get_full_fp32_param(p)) for p in trained)
    assert sd["1.weight"].dtype == torch.float32          # frozen: from the module weights, as fp32
    plain = build_model()
    plain.load_state_dict(sd)                             # strict: every key, the right shapes
    from dsfast.launcher.cli import main
    out = tmp_path / "full.safetensors"
    assert main(["consolidate", str(tmp_path), str(out)]) in (0, None)
    written = SafeTensorsFile(str(out)).tensors()
    assert written.keys() == sd.keys() and all(torch.equal(written[k], sd[k]) for k in sd)


def test_consolidate_cli_reports_a_missing_checkpoint(tmp_path, capsys):
    from dsfast.checkpoint.consolidate import main
    assert main([str(tmp_path), str(tmp_path / "o")]) == 2
    assert "no `latest` file" in capsys.readouterr().err


def test_tied_weights_consolidate_under_both_names(tmp_path):
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))

    engine, _, _, _ = dsfast.initialize(model=Tied(), config=config("bf16"), dist_init_required=False)
    engine.backward(engine(torch.tensor([1, 2])).float().sum())
    engine.step()
    engine.save_checkpoint(str(tmp_path), "t")
    sd = consolidate(str(tmp_path))
    assert torch.equal(sd["head.weight"], sd["emb.weight"])
    assert torch.equal(sd["emb.weight"], dsfast.utils.safe_get_full_fp32_param(engine.module.emb.weight))


# ---- config / async -----------------------------------------------------------------------------------------
def test_checkpoint_config_keys():
    from dsfast.config import load_config
    c = load_config(config={"train_batch_size": 1, "checkpoint": {"async_save": True, "timeout_s": 5,
                                                                   "tag_validation": "fail"}})
    assert c.checkpoint.async_save and c.checkpoint.timeout_s == 5 and c.checkpoint.tag_validation == "Fail"
    with pytest.raises(Exception, match="timeout_s"):
        load_config(config={"train_batch_size": 1, "checkpoint": {"timeout_s": 0}})
    with pytest.raises(Exception, match="async_save"):
        load_config(config={"train_batch_size": 1, "checkpoint": {"async_sav": True}})


def test_async_save_writes_host_copies_while_training_goes_on(tmp_path):
    from dsfast.checkpoint.async_save import last_save_stats, wait_pending
    engine = engine_for("fp16", async_save=True)
    train(engine, 0, 2)
    at_save = masters(engine)
    engine.save_checkpoint(str(tmp_path), "a", client_state={"step": 2})
    assert last_save_stats()["async"] and last_save_stats()["stall_s"] >= 0
    train(engine, 2, 4)                                   # changes the masters while the thread writes
    wait_pending()
    assert last_save_stats()["bytes"] > 0
    fresh = engine_for("fp16")
    _, client = fresh.load_checkpoint(str(tmp_path))
    assert client == {"step": 2} and same(masters(fresh), at_save)
    assert not any(n.startswith(".tmp-") for n in os.listdir(tmp_path))


def test_manifest_lists_world_stage_dtypes_and_every_slice(tmp_path):
    _saved(tmp_path, "bf16")
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert (m["world_size"], m["stage"], m["replicated"], m["precision"]) == (1, 0, True, "bf16")
    assert set(m["params"]) == {"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"}
    s = m["params"]["0.weight"]["slices"][0]
    assert (s["start"], s["stop"], s["file"]) == (0, 128, "optim_rank00000.safetensors")
    assert set(s["keys"]) == {"master", "exp_avg", "exp_avg_sq"} and s["scalars"]["step"]["value"] == 3.0
    assert all(set(info) == {"size", "sha256"} for info in m["files"].values())


def test_consecutive_async_saves_reuse_their_host_buffers_and_each_holds_its_own_step(tmp_path):
    from dsfast.checkpoint import snapshot
    from dsfast.checkpoint.async_save import wait_pending
    engine = engine_for("fp16", async_save=True)
    saved = {}
    for i, tag in enumerate(("a", "b", "c")):
        train(engine, 2 * i, 2 * i + 2)
        saved[tag] = masters(engine)
        buffers = dict(snapshot._buffers)
        engine.save_checkpoint(str(tmp_path), tag)
        if i:                                              # the second save copied into the first one's buffers
            assert all(snapshot._buffers[k] is v for k, v in buffers.items()) and buffers
    wait_pending()
    for tag, want in saved.items():
        fresh = engine_for("fp16")
        fresh.load_checkpoint(str(tmp_path), tag)
        assert same(masters(fresh), want), tag
    snapshot.release()
    assert not snapshot._buffers
