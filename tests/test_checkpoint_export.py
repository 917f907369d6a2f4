"""`dsfast consolidate` / zero_to_fp32's converters writing the Hugging Face layout, streamed: shards and index as
huggingface_hub splits them (read back with the real safetensors library), --dtype, --max-shard-size, tied weights
written once as save_pretrained writes them (and a from_pretrained round trip), inputs checked before anything is
written, and no complete-looking output after an interrupted export."""
import json
import os
import shutil

import pytest
import torch

import dsfast
from dsfast.checkpoint import CheckpointCorruptError, consolidate
from dsfast.checkpoint.consolidate import export, main
from dsfast.checkpoint.export_hf import parse_max_shard_size, plan_shards
from dsfast.checkpoint.consolidate import entries as checkpoint_entries

DS_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "deepspeed_ckpt")


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(40, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.norm.requires_grad_(False)                  # frozen: from the module weights
        self.register_buffer("count", torch.arange(3))   # an integer buffer keeps its dtype
        self.head = torch.nn.Linear(8, 40, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(self.norm(self.mid(self.emb(x))))


def saved(tmp_path, stage=2, precision="bf16"):
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": stage}}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine, _, _, _ = dsfast.initialize(model=Tied(), config=cfg, dist_init_required=False)
    for i in range(2):
        engine.backward(engine(torch.tensor([[1, 2], [3, 4]]) + i).float().pow(2).mean())
        engine.step()
    engine.save_checkpoint(str(tmp_path / "ck"), "t")
    return str(tmp_path / "ck")


def read_hf_dir(path):
    """{name: tensor} of a Hugging Face folder, read with the safetensors library through its index."""
    st = pytest.importorskip("safetensors.torch")
    index = os.path.join(path, "model.safetensors.index.json")
    if not os.path.exists(index):
        return st.load_file(os.path.join(path, "model.safetensors")), None
    with open(index) as f:
        idx = json.load(f)
    out = {}
    for name in sorted(set(idx["weight_map"].values())):
        part = st.load_file(os.path.join(path, name))
        assert {k for k, v in idx["weight_map"].items() if v == name} == set(part)
        out.update(part)
    return out, idx


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_sharded_export_is_the_consolidated_weights_split_as_huggingface_hub_splits(tmp_path, dtype):
    hub = pytest.importorskip("huggingface_hub")
    ck = saved(tmp_path)
    want = consolidate(ck)
    out = tmp_path / "hf"
    assert main([ck, str(out), "--dtype", dtype, "--max-shard-size", "400"]) == 0
    got, idx = read_hf_dir(str(out))
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    assert set(got) == set(want) - {"head.weight"}        # the tied second name is left out
    for k, v in got.items():
        cast = want[k].to(torch_dtype) if want[k].is_floating_point() else want[k]
        assert v.dtype == cast.dtype and torch.equal(v, cast), k
    # huggingface_hub's own split of the same (deduplicated) state_dict: the same files, tensors and total_size
    dedup = {k: (v.to(torch_dtype) if v.is_floating_point() else v).clone() for k, v in want.items()
             if k != "head.weight"}
    split = hub.split_torch_state_dict_into_shards(dedup, max_shard_size=400)
    assert idx["weight_map"] == split.tensor_to_filename and idx["metadata"] == split.metadata
    assert sorted(os.listdir(out)) == sorted(list(split.filename_to_tensors) + ["model.safetensors.index.json"])
    assert len(split.filename_to_tensors) >= 2 and "model-00001-of-0000" in idx["weight_map"]["emb.weight"]


def test_one_shard_is_model_safetensors_without_an_index_and_old_shards_are_removed(tmp_path):
    ck = saved(tmp_path)
    out = tmp_path / "hf"
    assert main([ck, str(out), "--max-shard-size", "1KB"]) == 0          # a sharded export first
    (out / "config.json").write_text("{}")                              # a file that is not ours stays
    assert main([ck, str(out)]) == 0                                     # then one file (5GB default)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    got, idx = read_hf_dir(str(out))
    assert idx is None and set(got) == set(consolidate(ck)) - {"head.weight"}


def test_max_shard_size_reads_huggingface_strings_and_ints():
    hub = pytest.importorskip("huggingface_hub")
    for text in ("5GB", "500MB", "1.5KB", "2TB", "10kb"):
        assert parse_max_shard_size(text) == hub.serialization._base.parse_size_to_int(text)
    assert parse_max_shard_size(1000) == 1000 and parse_max_shard_size("1000") == 1000
    for bad in ("5 parsecs", "GB", 0, -3, "abcMB", True):
        with pytest.raises(ValueError, match="max_shard_size"):
            parse_max_shard_size(bad)


def test_cli_refuses_a_bad_size_or_dtype_before_writing(tmp_path, capsys):
    ck = saved(tmp_path)
    assert main([ck, str(tmp_path / "o"), "--max-shard-size", "5GiB"]) == 2
    assert "max_shard_size '5GiB'" in capsys.readouterr().err and not (tmp_path / "o").exists()
    with pytest.raises(SystemExit):
        main([ck, str(tmp_path / "o"), "--dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err and not (tmp_path / "o").exists()
    (tmp_path / "o").write_text("a file, not a folder")
    assert main([ck, str(tmp_path / "o")]) == 2
    assert "File exists" in capsys.readouterr().err and (tmp_path / "o").read_text() == "a file, not a folder"
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert all(s in text for s in ("--max-shard-size", "--dtype", "model.safetensors.index.json", "streamed"))


def test_tied_weight_written_once_as_save_pretrained_and_from_pretrained_round_trip(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    engine, _, _, _ = dsfast.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}, dist_init_required=False)
    ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    engine.save_checkpoint(str(tmp_path / "ck"), "t")
    want = consolidate(str(tmp_path / "ck"))
    out = tmp_path / "hf"
    export(str(tmp_path / "ck"), str(out), max_shard_size="20KB")
    cfg.save_pretrained(str(out))
    # save_pretrained of the same model keeps the same names (lm_head.weight, the tied duplicate, left out)
    plain = transformers.LlamaForCausalLM(cfg)
    plain.save_pretrained(str(tmp_path / "ref"), max_shard_size="20KB")
    got, idx = read_hf_dir(str(out))
    ref, _ = read_hf_dir(str(tmp_path / "ref"))
    assert set(got) == set(ref) and "lm_head.weight" not in got and idx is not None
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    sd = loaded.state_dict()
    assert set(sd) == set(want)
    for k in want:
        assert torch.equal(sd[k], want[k]), k
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()   # tied again


def test_zero_to_fp32_converters_stream_both_formats_with_ties(tmp_path):
    from dsfast.utils.zero_to_fp32 import convert_zero_checkpoint_to_state_dict
    ck = saved(tmp_path)
    want = consolidate(ck)
    convert_zero_checkpoint_to_state_dict(ck, str(tmp_path / "bin"), dtype="bf16", max_shard_size="400")
    with open(tmp_path / "bin" / "pytorch_model.bin.index.json") as f:
        idx = json.load(f)
    got = {}
    for name in sorted(set(idx["weight_map"].values())):
        got.update(torch.load(tmp_path / "bin" / name, weights_only=True))
    assert set(got) == set(want) == set(idx["weight_map"])       # torch files keep both tied names, shared
    assert got["head.weight"].data_ptr() == got["emb.weight"].data_ptr()
    assert all(torch.equal(got[k], want[k].to(torch.bfloat16) if want[k].is_floating_point() else want[k])
               for k in want)
    convert_zero_checkpoint_to_state_dict(ck, str(tmp_path / "st"), max_shard_size=None, safe_serialization=True)
    got, idx = read_hf_dir(str(tmp_path / "st"))
    assert idx is None and set(got) == set(want) - {"head.weight"}


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_truncated_or_missing_input_is_named_before_anything_is_written(tmp_path, damage):
    ck = saved(tmp_path)
    victim = os.path.join(ck, "t", "optim_rank00000.safetensors")
    if damage == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) - 5)
    else:
        os.remove(victim)
    for out in (tmp_path / "hf", tmp_path / "one.safetensors"):
        with pytest.raises(CheckpointCorruptError, match=r"optim_rank00000\.safetensors"):
            export(ck, str(out), one_file=str(out).endswith(".safetensors"))
        assert not out.exists()


def test_a_missing_deepspeed_rank_file_is_named_before_anything_is_written(tmp_path):
    src = os.path.join(DS_DATA, "stage2_fp32", "global_step2")
    shutil.copytree(src, tmp_path / "ds")
    victim = [f for f in os.listdir(tmp_path / "ds") if "rank_1" in f and f.endswith("optim_states.pt")][0]
    with open(tmp_path / "ds" / victim, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointCorruptError, match=victim):
        export(str(tmp_path / "ds"), str(tmp_path / "hf"))
    os.remove(tmp_path / "ds" / victim)
    with pytest.raises(CheckpointCorruptError, match=r"rank 1.*missing|missing.*rank 1"):
        export(str(tmp_path / "ds"), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("one_file", [False, True])
def test_an_interrupted_export_leaves_no_output_that_looks_complete(tmp_path, one_file):
    ck = saved(tmp_path)
    out = tmp_path / ("one.safetensors" if one_file else "hf")
    export(ck, str(out), max_shard_size="1KB", one_file=one_file)     # a complete earlier export
    before = {p: open(os.path.join(out, p) if not one_file else out, "rb").read()
              for p in (os.listdir(out) if not one_file else ["."])}
    calls = []

    def killed(stage):
        calls.append(stage)
        if len(calls) == 4:
            raise KeyboardInterrupt("killed mid-export")
    with pytest.raises(KeyboardInterrupt):
        export(ck, str(out), dtype="bf16", max_shard_size="1KB", one_file=one_file, fault=killed)
    # the earlier export is untouched, and nothing else (no temporary file or folder) is left
    if one_file:
        assert sorted(os.listdir(tmp_path)) == ["ck", "one.safetensors"] and out.read_bytes() == before["."]
    else:
        assert sorted(os.listdir(out)) == sorted(before)
        assert all(open(os.path.join(out, p), "rb").read() == b for p, b in before.items())
    shutil.rmtree(out) if not one_file else os.remove(out)
    with pytest.raises(KeyboardInterrupt):
        calls.clear()
        export(ck, str(out), max_shard_size="1KB", one_file=one_file, fault=killed)
    assert not out.exists() or os.listdir(out) == []


def test_plan_matches_huggingface_hub_with_a_tensor_larger_than_the_limit(tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    ck = saved(tmp_path)
    found, _ = checkpoint_entries(ck)
    want = consolidate(ck)
    dedup = {k: v for k, v in want.items() if k != "head.weight"}
    limit = 600     # emb.weight (1280 bytes) is larger: alone in its file, before the current one
    shards, total = plan_shards(found, torch.float32, limit)
    split = hub.split_torch_state_dict_into_shards(dedup, max_shard_size=limit)
    assert [[e.name for e in s] for s in shards] == list(split.filename_to_tensors.values())
    assert total == split.metadata["total_size"]


@pytest.mark.parametrize("stage,dtype", [(0, "bf16"), (2, "fp32"), (3, "bf16")])
def test_deepspeed_checkpoints_export_streamed(tmp_path, stage, dtype):
    folder = os.path.join(DS_DATA, f"stage{stage}_{dtype}")
    want = torch.load(os.path.join(folder, "expected.pt"))
    export(folder, str(tmp_path / "hf"), max_shard_size="200")
    got, idx = read_hf_dir(str(tmp_path / "hf"))
    assert idx is not None and set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_cli_torch_file_and_one_safetensors_file_keep_working(tmp_path):
    ck = saved(tmp_path)
    want = consolidate(ck)
    assert main([ck, str(tmp_path / "w.pt"), "--torch", "--dtype", "bf16"]) == 0
    got = torch.load(tmp_path / "w.pt", weights_only=True)
    assert set(got) == set(want) and got["head.weight"].data_ptr() == got["emb.weight"].data_ptr()
    assert all(torch.equal(got[k], want[k].to(torch.bfloat16) if want[k].is_floating_point() else want[k])
               for k in want)
    assert main([ck, str(tmp_path / "w.safetensors"), "--exclude-frozen"]) == 0
    st = pytest.importorskip("safetensors.torch")
    got = st.load_file(str(tmp_path / "w.safetensors"))
    assert set(got) == set(want) - {"head.weight", "norm.weight", "norm.bias"}      # frozen left out, buffer kept
    assert all(torch.equal(got[k], want[k]) for k in got)
    assert sorted(os.listdir(tmp_path)) == ["ck", "w.pt", "w.safetensors"]            # no temporary file left


def test_lazy_mode_reads_each_tensor_at_contiguous(tmp_path, monkeypatch):
    from dsfast.checkpoint.safetensors_io import SafeTensorsFile
    from dsfast.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    ck = saved(tmp_path)
    want = consolidate(ck)
    reads = []
    real_get = SafeTensorsFile.get
    monkeypatch.setattr(SafeTensorsFile, "get", lambda self, name: (reads.append(name), real_get(self, name))[1])
    lazy = get_fp32_state_dict_from_zero_checkpoint(ck, lazy_mode=True)
    assert reads == [] and set(lazy) == set(want)                          # nothing read yet
    assert lazy["head.weight"] is lazy["emb.weight"]                       # tied: one placeholder
    for k, v in lazy.items():
        assert v.shape == want[k].shape and v.dtype == want[k].dtype
        got = v.contiguous()
        assert torch.equal(got, want[k]), k
    assert len([r for r in reads if r.startswith("emb.weight")]) == 2     # read at each .contiguous(), no cache


@pytest.mark.parametrize("stage", [0, 3])
def test_export_at_stage_0_and_3_is_the_consolidated_weights(tmp_path, stage):
    ck = saved(tmp_path, stage=stage)
    want = consolidate(ck)
    export(ck, str(tmp_path / "hf"), dtype="bf16", max_shard_size="400")
    got, idx = read_hf_dir(str(tmp_path / "hf"))
    assert idx is not None and set(got) == set(want) - {"head.weight"}
    for k, v in got.items():
        assert torch.equal(v, want[k].to(torch.bfloat16) if want[k].is_floating_point() else want[k]), k


def test_deepspeed_shared_params_are_the_first_name_s_master_written_once(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import export_memory
    export_memory.build_deepspeed(str(tmp_path / "ds"), tensors=3, numel=2048, ranks=2, states=(), tied=True)
    sd = consolidate(str(tmp_path / "ds"))
    assert sd["tied.weight"] is sd["0.weight"] and sd["0.weight"].dtype == torch.float32   # the master, not bf16
    assert not torch.equal(sd["0.weight"], sd["0.weight"].to(torch.bfloat16).float())
    export(str(tmp_path / "ds"), str(tmp_path / "hf"))
    got, _ = read_hf_dir(str(tmp_path / "hf"))
    assert set(got) == {"0.weight", "1.weight", "2.weight"} and torch.equal(got["0.weight"], sd["0.weight"])


def test_an_export_killed_mid_write_leaves_only_a_hidden_temporary_folder(tmp_path):
    import subprocess
    import sys
    ck = saved(tmp_path)
    out = tmp_path / "hf"
    code = ("import os, signal, sys\n"
            "from dsfast.checkpoint.consolidate import export\n"
            "n = []\n"
            "def kill(stage):\n"
            "    n.append(stage)\n"
            "    if len(n) == 5:\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "export(sys.argv[1], sys.argv[2], max_shard_size='400', fault=kill)\n")
    r = subprocess.run([sys.executable, "-c", code, ck, str(out)], capture_output=True, text=True)
    assert r.returncode == -9, r.stderr
    left = os.listdir(out)
    assert len(left) == 1 and left[0].startswith(".dsfast-export-")      # nothing a loader would pick up
    assert any(f.endswith(".safetensors") for f in os.listdir(out / left[0]))   # it had written part
    export(ck, str(out), max_shard_size="400")                           # a rerun completes beside it
    got, idx = read_hf_dir(str(out))
    assert idx is not None and set(got) == set(consolidate(ck)) - {"head.weight"}
