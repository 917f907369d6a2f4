"""dsfast.zero.planning.plan (`dsfast plan`) and offload_optimizer device "auto": with the host's figures fixed,
the plan's
rows, fit at the memory boundary, order and predicted step floors are exact; its JSON validates as a config;
initialize() takes the plan's choice. Model counts against published parameter counts."""
import json
import logging
import math
import struct

import pytest
import torch

import dsfast
from dsfast.config import parse_config
from dsfast.zero.planning import auto_offload
from dsfast.zero.planning.estimate import estimate_model_states
from dsfast.zero.planning.host_figures import HostFigures, measure_host
from dsfast.zero.planning import model_count
from dsfast.zero.planning.model_count import count_hf_config, count_model, parse_count
from dsfast.zero.planning.plan import config_section, main, make_plan

GIB = 1 << 30
PSI = 10 ** 9


def _fig(**kw):
    base = dict(host_available=64 * GIB, host_gbs=20.0, device_memory=8 * GIB, device_gbs=2000.0)
    return HostFigures(**{**base, **kw})


def _key(r):
    return r["stage"], r["offload_optimizer"], r["offload_param"], r["masters"], r["states"]


# ---- model counts --------------------------------------------------------------------------------------------
GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12}
LLAMA2_7B = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
             "tie_word_embeddings": False}


def _without_transformers(monkeypatch):
    def missing(cfg):
        raise ImportError("transformers")
    monkeypatch.setattr(model_count, "_count_on_meta", missing)


@pytest.mark.parametrize("how", ["formula", "meta"])
@pytest.mark.parametrize("cfg, published", [(GPT2, 124_439_808), (LLAMA2_7B, 6_738_415_616)])
def test_hf_configs_count_as_published(monkeypatch, how, cfg, published):
    if how == "formula":
        _without_transformers(monkeypatch)
    else:
        pytest.importorskip("transformers")
    assert count_hf_config(cfg)[0] == published


def test_counts_from_numbers_and_weight_files(tmp_path):
    assert parse_count("1.3B") == 1_300_000_000 and parse_count("350M") == 350_000_000 and parse_count("7e9") == 7e9
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.Linear(33, 8))
    torch.save({"module": model.state_dict()}, tmp_path / "m.pt")
    assert count_model(tmp_path / "m.pt") == (16 * 33 + 33 + 33 * 8 + 8, 16 * 33)
    header = json.dumps({"a": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 60]},
                         "b": {"dtype": "F32", "shape": [7], "data_offsets": [60, 88]},
                         "__metadata__": {"format": "pt"}}).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(88))
    assert count_model(str(tmp_path / "m.safetensors")) == (22, 15)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(GPT2))
    assert count_model(str(tmp_path / "hf"))[0] == 124_439_808


@pytest.mark.parametrize("spec, match", [("nowhere.json", "neither a parameter count"), ("0", "at least 1"),
                                         ("-5", "at least 1"), ("lots", "neither a parameter count")])
def test_bad_model_specs_are_refused_by_name(spec, match):
    with pytest.raises(ValueError, match=match):
        count_model(spec)


def test_bad_model_files_are_refused_by_name(tmp_path, monkeypatch):
    _without_transformers(monkeypatch)   # with it, transformers fills in its defaults
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"m.onnx.*unknown kind"):
        count_model(str(tmp_path / "m.onnx"))
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"bad.pt: cannot be read as a torch state dict"):
        count_model(str(tmp_path / "bad.pt"))
    (tmp_path / "c.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    with pytest.raises(ValueError, match=r"c.json: none of num_hidden_layers"):
        count_model(str(tmp_path / "c.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        count_model(str(tmp_path / "empty"))


# ---- the plan --------------------------------------------------------------------------------------------------
def test_rows_carry_estimate_bytes_and_the_order_is_precision_then_floor_then_device_bytes():
    rows = make_plan(PSI, 2, _fig(), local_ranks=2, headroom=1.0)
    est = {(r["stage"], r["offload_optimizer"], r["offload_param"]): r for r in estimate_model_states(PSI, 2)}
    for r in rows:
        if r["masters"] == r["states"] == "fp32":
            assert r["device"] == est[r["stage"], r["offload_optimizer"], r["offload_param"]]["device"]
    fitting = [r for r in rows if not r["why_not"]]
    # fp32 without offload fits 8 GiB only at stage 3 (16 psi / 2 = 7.45 GiB; stage 2: 2 psi + 14 psi / 2), the
    # parameters offloaded or not: the step on each rank's own device (not shared), the fewest transfers first
    assert [_key(r) for r in fitting[:2]] == [(3, False, False, "fp32", "fp32"), (3, False, True, "fp32", "fp32")]
    assert fitting[0]["floor_s"] == pytest.approx(28 * PSI / 2 / 2000e9)
    # then the host step: 28 bytes x psi/2 x 2 ranks sharing 20 GB/s; stage 2 has fewer device bytes than 1,
    # stage 3 gathers (and with offload_param moves the parameters too)
    assert [_key(r)[:3] for r in fitting[2:6]] == [(2, True, False), (1, True, False), (3, True, False),
                                                   (3, True, True)]
    assert fitting[2]["floor_s"] == pytest.approx(28 * PSI / 20e9)
    tiers = [(r["masters"], r["states"]) for r in fitting]
    assert tiers == sorted(tiers, key=[("fp32", "fp32"), ("bf16", "fp32"), ("fp32", "int8"), ("bf16", "bf16")].index)
    bf16_host = next(r for r in fitting if r["states"] == "bf16" and r["offload_optimizer"])
    assert bf16_host["floor_s"] == pytest.approx(14 * PSI / 20e9)
    assert all(r["why_not"] for r in rows[len(fitting):])


def test_prefer_speed_ranks_by_the_floor_alone():
    rows = [r for r in make_plan(PSI, 2, _fig(), 2, headroom=1.0, prefer="speed") if not r["why_not"]]
    floors = [r["floor_s"] for r in rows]
    assert floors == sorted(floors)
    assert rows[0]["offload_optimizer"] is False and rows[0]["states"] == "bf16"
    assert rows[0]["floor_s"] == pytest.approx(14 * PSI / 2 / 2000e9)


def test_fit_and_no_fit_at_the_host_memory_boundary():
    only = lambda r: _key(r) == (2, True, False, "fp32", "fp32")   # noqa: E731
    need = make_plan(PSI, 2, _fig(), 2, headroom=1.0, only=only)[0]["host"] * 2
    assert make_plan(PSI, 2, _fig(host_available=need), 2, headroom=1.0, only=only)[0]["why_not"] == []
    short = make_plan(PSI, 2, _fig(host_available=need - 1), 2, headroom=1.0, only=only)[0]
    assert len(short["why_not"]) == 1 and short["why_not"][0].startswith("host needs")
    # headroom scales the budget: 0.5 of twice the need is the need
    assert make_plan(PSI, 2, _fig(host_available=2 * need), 2, headroom=0.5, only=only)[0]["why_not"] == []


def test_device_and_nvme_boundaries_and_the_disk_floor():
    fig = _fig(host_available=4 * GIB, nvme_path="/nvme", nvme_free=100 * GIB, nvme_read_gbs=2.0,
               nvme_write_gbs=1.0)
    rows = make_plan(PSI, 1, fig, headroom=1.0)
    best = next(r for r in rows if not r["why_not"])
    # 12 GB of states fit neither the 8 GiB device nor the 4 GiB host; stage 1-2's NVMe window (4 buffers of a
    # 5e8-element bucket's states) does not fit the host either: stage 3's (of the largest layer) does
    assert _key(best)[:3] == (3, "nvme", False)
    stage2 = next(r for r in rows if _key(r)[:3] == (2, "nvme", False))
    assert stage2["why_not"] and stage2["why_not"][0].startswith("host needs")
    disk = best["nvme"]
    assert best["floor_s"] == pytest.approx(max(28 * PSI / 20e9, disk / 2e9 + disk / 1e9))
    tight = make_plan(PSI, 1, _fig(host_available=4 * GIB, nvme_path="/nvme", nvme_free=int(disk) - 1,
                                   nvme_read_gbs=2.0, nvme_write_gbs=1.0), headroom=1.0,
                      only=lambda r: _key(r) == (3, "nvme", False, "fp32", "fp32"))[0]
    assert any(w.startswith("NVMe needs") for w in tight["why_not"])
    no_gpu = make_plan(PSI, 1, _fig(device_memory=None), headroom=1.0, only=lambda r: _key(r)[:3] == (1, True, False))
    # the CPU trains: its device bytes count against the host too, and the step runs at the host's bandwidth
    assert no_gpu[0]["floor_s"] == pytest.approx(28 * PSI / 20e9)


def test_int8_rows_offload_only_with_their_bytes_and_floor_and_config(tmp_path):
    """8-bit moments (offload_optimizer.state_precision "int8"): cpu and nvme rows at stages 1-3 with fp32
    masters, host / disk bytes from the estimate with 8-bit moments (4 + 2 + 8/256 bytes a parameter on disk), and
    the floor from the 16 + 16/256 bytes the 8-bit step moves a parameter (benchmarks/cpu_optim.py's count)."""
    from dsfast.zero.policy.partition import INT8_MOMENT_BYTES
    fig = _fig(nvme_path=str(tmp_path), nvme_free=10 ** 13, nvme_read_gbs=2.0, nvme_write_gbs=1.0)
    rows = [r for r in make_plan(PSI, 2, fig, 2, headroom=1.0) if r["states"] == "int8"]
    assert {(r["stage"], r["offload_optimizer"]) for r in rows} >= {(s, o) for s in (1, 2, 3) for o in (True, "nvme")}
    assert all(r["masters"] == "fp32" and r["offload_optimizer"] for r in rows)
    est = {(r["stage"], r["offload_optimizer"], r["offload_param"]): r
           for r in estimate_model_states(PSI, 2, nvme=True, states8=True)}
    for r in rows:
        want = est[r["stage"], r["offload_optimizer"], r["offload_param"]]
        assert (r["host"], r["device"], r.get("nvme", 0)) == (want["host"], want["device"], want.get("nvme", 0))
        moved = (16 + 16 / 256) * PSI / 2 * 2 / 20e9     # 2 local ranks share the host's 20 GB/s
        read = r["nvme"] * 2 if r["offload_optimizer"] == "nvme" else 0   # offload_param's shards: written only
        if read:   # the first buffer_count - 2 = 2 units are read ahead during forward and backward
            units = math.ceil(PSI / 2 / r["nvme_unit"])
            read *= max(0, units - 2) / units
        written = r.get("nvme", 0) * 2
        floor = max(moved, read / 2e9 + written / 1e9) if written else moved
        assert r["floor_s"] == pytest.approx(floor)
        section = config_section(r, fig)
        assert section["zero_optimization"]["offload_optimizer"]["state_precision"] == "int8"
    cpu2 = next(r for r in rows if (r["stage"], r["offload_optimizer"], r["offload_param"]) == (2, True, False))
    assert cpu2["host"] == pytest.approx((4 + INT8_MOMENT_BYTES) * PSI / 2)   # fp32 master + codes and scales
    nvme2 = next(r for r in rows if (r["stage"], r["offload_optimizer"]) == (2, "nvme"))
    assert nvme2["nvme"] == pytest.approx((4 + INT8_MOMENT_BYTES) * PSI / 2, abs=1)
    # between the fp32-moment and the bf16-master rows in precision; faster than the fp32-state host step
    ranked = [_key(r) for r in make_plan(PSI, 2, fig, 2, headroom=1.0) if r["offload_optimizer"] is True
              and r["stage"] == 2 and not r["why_not"]]
    assert [k[3:] for k in ranked] == [("fp32", "fp32"), ("bf16", "fp32"), ("fp32", "int8"), ("bf16", "bf16")]


def test_cpu_trained_bf16_masters_count_the_parameter_shard_once():
    """Where the CPU trains, offload's 16-bit host master copy is the parameter shard itself: host bytes are the
    row's host plus device bytes less that copy (a stage 2 bf16 run measures 8 bytes a parameter, not 10)."""
    from dsfast.zero.planning.plan import host_bytes
    fig = _fig(device_memory=None)
    rows = make_plan(PSI, 1, fig, 1, headroom=1.0, only=lambda r: r["stage"] == 2 and r["offload_optimizer"] is True)
    by = {r["masters"] + "/" + r["states"]: r for r in rows}
    assert host_bytes(by["bf16/bf16"], fig) == 8 * PSI        # bf16 params 2, grads 2, moments 4
    assert host_bytes(by["fp32/fp32"], fig) == 16 * PSI       # the fp32 masters are separate from the bf16 params
    assert host_bytes(by["bf16/bf16"], _fig()) == by["bf16/bf16"]["host"] == 6 * PSI   # a GPU run: its own copy


def test_nvme_floor_leaves_out_the_units_read_during_forward_and_backward():
    fig = _fig(nvme_path="/nvme", nvme_free=10 ** 13, nvme_read_gbs=2.0, nvme_write_gbs=1.0, host_gbs=1e6)
    key = (2, "nvme", False, "fp32", "fp32")
    for bucket, buffers in ((1e8, 4), (1e8, 6), (5e8, 4)):
        row = make_plan(PSI, 1, fig, 1, headroom=1.0, bucket=bucket, buffer_count=buffers,
                        only=lambda r: _key(r) == key)[0]
        units = math.ceil(PSI / (bucket + 1))      # 10 or 2 units; buffer_count - 2 of them read ahead
        read = 12 * PSI * max(0, units - (buffers - 2)) / units
        assert row["floor_s"] == pytest.approx(read / 2e9 + 12 * PSI / 1e9)


@pytest.mark.parametrize("kw, match", [(dict(world_size=0), "world_size must be"),
                                       (dict(local_ranks=3), "local_ranks between"),
                                       (dict(headroom=0), "headroom must be"), (dict(prefer="fast"), "prefer")])
def test_bad_plan_arguments_are_refused(kw, match):
    args = {**dict(params=PSI, world_size=2, fig=_fig()), **kw}
    with pytest.raises(ValueError, match=match):
        make_plan(**args)


def test_bad_figures_are_refused():
    with pytest.raises(ValueError, match="host_gbs must be > 0"):
        measure_host(bandwidth=False, host_gbs=0)
    with pytest.raises(ValueError, match="unknown host figure"):
        measure_host(bandwidth=False, ram=1)
    with pytest.raises(ValueError, match="is not a directory"):
        measure_host("/no/such/dir", bandwidth=False)


def test_cli_writes_json_that_validates_as_a_config(tmp_path, capsys):
    out = tmp_path / "zero.json"
    rc = main(["--model", "1e9", "--world-size", "2", "--host-gib", "64", "--device-gib", "8", "--bandwidth-gbs",
               "20", "--device-bandwidth-gbs", "2000", "--headroom", "1", "--out", str(out)])
    assert rc == 0
    section = json.loads(out.read_text())
    assert section["zero_optimization"]["stage"] == 3
    assert section["zero_optimization"]["offload_optimizer"]["device"] == "none"
    cfg = parse_config({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, **section}, world_size=2)
    assert cfg.zero_stage == 3
    printed = capsys.readouterr().out
    assert "step floor" in printed and "best: " in printed
    # a bare count does not say how large the largest layer is: the stage 3 rows leave it out, and say so
    assert "largest layer unknown: stage 3 rows leave out its gathered layer" in printed
    main(["--model", "1e9", "--largest-layer", "5e7", "--world-size", "2", "--host-gib", "64", "--device-gib", "8",
          "--bandwidth-gbs", "20", "--device-bandwidth-gbs", "2000", "--headroom", "1"])
    assert "(largest layer 50.0M)" in capsys.readouterr().out


def test_every_fitting_row_validates_as_a_config(tmp_path):
    fig = _fig(nvme_path=str(tmp_path), nvme_free=10 ** 12, nvme_read_gbs=2.0, nvme_write_gbs=1.0, memlock=GIB)
    for r in make_plan(PSI, 2, fig, 2, headroom=1.0):
        section = config_section(r, fig)
        data = {"train_micro_batch_size_per_gpu": 1, **section}
        data.setdefault("bf16", {"enabled": True})
        parse_config(data, world_size=2)
        off = section["zero_optimization"].get("offload_optimizer", {})
        if off.get("device") not in (None, "none"):   # pinned only within ulimit -l
            assert off["pin_memory"] == (r["host"] <= GIB)


def test_cli_refuses_bad_input(capsys):
    with pytest.raises(SystemExit):
        main(["--model", "0", "--world-size", "1", "--skip-bandwidth"])
    assert "at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "1e9", "--world-size", "1", "--host-gib", "-1", "--skip-bandwidth"])
    assert "--host-gib must be > 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "1e9", "--world-size", "1", "--device-gib", "8", "--bandwidth-gbs", "20"]
             if not torch.cuda.is_available() else ["--model", "1e9", "--world-size", "0"])
    assert "needs --device-bandwidth-gbs" in capsys.readouterr().err or torch.cuda.is_available()


def test_cli_says_when_nothing_fits(capsys):
    rc = main(["--model", "1e12", "--world-size", "1", "--host-gib", "1", "--device-gib", "1", "--bandwidth-gbs",
               "20", "--device-bandwidth-gbs", "2000"])
    assert rc == 1 and "nothing fits" in capsys.readouterr().out


# ---- "auto" at initialize --------------------------------------------------------------------------------------
def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


NPARAMS = 16 * 33 + 33 + 33 * 8 + 8


def _auto_cfg(stage=2, **off):
    return {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "auto", **off}}}


@pytest.mark.parametrize("device_memory, expected", [(None, "none"), (64 * GIB, "none"),
                                                      (int(12 * NPARAMS / 0.9), "cpu")])
def test_auto_takes_the_plans_placement_at_initialize(monkeypatch, caplog, device_memory, expected):
    # fp32 training at stage 2, one rank: no offload needs 16 bytes/param on the device, cpu offload 8
    monkeypatch.setattr(auto_offload, "measured_figures",
                        lambda device, path: HostFigures(host_available=64 * GIB, device_memory=device_memory))
    model = _model()
    with caplog.at_level(logging.WARNING, logger="dsfast.zero"):
        engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=_auto_cfg(),
                                   dist_init_required=False)[0]
    assert engine.config.zero_optimization.offload_optimizer_device == expected
    assert f'"auto" -> "{expected}"' in caplog.text
    x = torch.randn(4, 16)
    loss = engine(x).pow(2).mean()
    engine.backward(loss)
    engine.step()
    assert torch.isfinite(loss)


def test_auto_with_int8_states_plans_from_the_int8_rows(monkeypatch, caplog):
    """state_precision "int8" beside device "auto": the plan's int8 rows (8-bit host moments: offload only) decide,
    so the choice is a host optimizer with 8-bit moments even where the device could hold fp32 states, and their
    smaller host bytes fit where fp32 states would have needed NVMe."""
    monkeypatch.setattr(auto_offload, "measured_figures",
                        lambda device, path: HostFigures(host_available=64 * GIB, device_memory=64 * GIB))
    model = _model()
    with caplog.at_level(logging.WARNING, logger="dsfast.zero"):
        engine = dsfast.initialize(model=model, model_parameters=model.parameters(),
                                   config=_auto_cfg(state_precision="int8"), dist_init_required=False)[0]
    assert engine.config.zero_optimization.offload_optimizer_device == "cpu" and '"auto" -> "cpu"' in caplog.text
    assert "8bit" in type(engine.optimizer).__name__   # (CPUAdamW8bit: the host optimizer with 8-bit moments)
    engine.backward(engine(torch.randn(4, 16)).pow(2).mean())
    engine.step()
    # the host-memory boundary, one rank at stage 2 (fp32 training): between the int8 row's and the fp32 row's
    fig = HostFigures(device_memory=64 * GIB, nvme_free=10 ** 13)
    rows = make_plan(PSI, 1, fig, 1, mixed=False, headroom=1.0)
    host = {r["states"]: r["host"] for r in rows if r["stage"] == 2 and r["offload_optimizer"] is True
            and r["offload_param"] is False and r["masters"] == "fp32"}
    assert host["int8"] < host["fp32"]
    cut = (host["int8"] + host["fp32"]) / 2 / 0.9   # (auto keeps 10% of the host free)
    fig = HostFigures(host_available=cut, device_memory=16 * GIB, nvme_path="/nvme", nvme_free=10 ** 13)
    for precision, expected in (("int8", "cpu"), ("fp32", "nvme")):
        data = _auto_cfg(stage=2, nvme_path="/nvme", state_precision=precision)
        data["zero_optimization"]["reduce_bucket_size"] = 10 ** 7   # (the NVMe window: 4 units of 1e7 elements)
        assert auto_offload.choose(parse_config(data, world_size=1), PSI, 0, 1, 1, fig)[0] == expected, precision


def test_auto_refuses_when_nothing_fits_and_names_the_placements(monkeypatch):
    monkeypatch.setattr(auto_offload, "measured_figures",
                        lambda device, path: HostFigures(host_available=1000, device_memory=1000))
    model = _model()
    with pytest.raises(ValueError, match=r'"auto": no placement .* fits') as err:
        dsfast.initialize(model=model, model_parameters=model.parameters(), config=_auto_cfg(),
                          dist_init_required=False)
    assert "none: device needs" in str(err.value) and "cpu: device needs" in str(err.value)
    assert 'give "nvme_path"' in str(err.value)


def test_auto_picks_nvme_only_with_a_path_and_when_the_host_is_short(tmp_path):
    # fp32 at stage 2, one rank: no offload needs 16 GB (> 0.9 x 16 GiB), cpu offload 8 GB on the device and 8 GB
    # of states on the host; NVMe keeps 4 buffers of the config's 1e7-element bucket (0.48 GB) on the host
    data = _auto_cfg(stage=2, nvme_path=str(tmp_path))
    data["zero_optimization"]["reduce_bucket_size"] = 10 ** 7
    cfg = parse_config(data, world_size=1)
    fig = HostFigures(host_available=8 * GIB, device_memory=16 * GIB, nvme_path=str(tmp_path), nvme_free=10 ** 12)
    assert auto_offload.choose(cfg, PSI, 0, 1, 1, fig)[0] == "nvme"     # 8 GB of states > 0.9 x 8 GiB
    fig.host_available = 16 * GIB
    assert auto_offload.choose(cfg, PSI, 0, 1, 1, fig)[0] == "cpu"
    fig.nvme_path, fig.host_available = None, 8 * GIB
    with pytest.raises(ValueError, match="no placement"):
        auto_offload.choose(parse_config(_auto_cfg(stage=2), world_size=1), PSI, 0, 1, 1, fig)


def test_auto_where_it_cannot_apply_is_refused():
    with pytest.raises(ValueError, match=r'offload_optimizer.device: "auto" picks .*stage is 0'):
        parse_config(_auto_cfg(stage=0), world_size=1)
    cfg = parse_config({**_auto_cfg(), "fp16": {"enabled": True, "fp16_master_weights_and_grads": True}},
                       world_size=1)
    with pytest.raises(ValueError, match='does not plan fp16 masters'):
        auto_offload.choose(cfg, PSI, 0, 1, 1, _fig())


def test_explain_says_what_auto_does():
    from dsfast.config.explain import explain
    rows = {k: (v, o) for k, v, o in explain(_auto_cfg())}
    value, origin = rows["zero_optimization.offload_optimizer.device"]
    assert value == "auto" and origin.startswith("user; dsfast:") and "picks" in origin


def test_dsfast_plan_is_a_cli_subcommand(capsys):
    from dsfast.launcher.cli import main as dsfast_main
    rc = dsfast_main(["plan", "--model", "1e9", "--world-size", "1", "--host-gib", "64", "--device-gib", "80",
                      "--bandwidth-gbs", "20", "--device-bandwidth-gbs", "2000"])
    assert rc == 0 and '"offload_optimizer": {"device": "none"}' in capsys.readouterr().out


def test_auto_beside_parameters_on_nvme_keeps_to_what_the_sections_allow(tmp_path):
    data = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "auto"},
        "offload_param": {"device": "nvme", "nvme_path": str(tmp_path)}}}
    cfg = parse_config(data, world_size=1)
    fig = HostFigures(host_available=64 * GIB, device_memory=16 * GIB, nvme_path=str(tmp_path), nvme_free=10 ** 12)
    assert auto_offload.choose(cfg, PSI, 10 ** 7, 1, 1, fig)[0] == "cpu"    # "nvme" would need its own nvme_path
    with pytest.raises(ValueError, match='has no placement to choose from with offload_param "nvme"'):
        auto_offload.choose(cfg, PSI, 10 ** 7, 1, 1, HostFigures(host_available=64 * GIB, device_memory=16 * GIB))


def test_a_config_transformers_cannot_build_is_refused_by_file():
    pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="cfg.json: transformers cannot build a causal LM"):
        count_hf_config({"model_type": "t5"}, "cfg.json")


def test_ranks_that_disagree_take_the_slowest_placement(monkeypatch):
    import torch.distributed as dist

    def gather(out, mine):   # this rank says "none", the other one found too little memory for it
        out[:] = [mine, "cpu"]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 2)
    monkeypatch.setattr(dist, "all_gather_object", gather)
    assert auto_offload._slowest_over_ranks("none") == "cpu"
    assert auto_offload._slowest_over_ranks("nvme") == "nvme"


def test_the_measurements_run_short_and_refuse_a_memory_filesystem(tmp_path, monkeypatch):
    from dsfast.zero.planning import host_figures
    assert 0 < host_figures.memory_bandwidth_gbs(0.01, 1 << 20) < 1e5
    fig = measure_host(str(tmp_path), bandwidth=False, host_available=GIB)
    assert fig.host_available == GIB and fig.nvme_free > 0 and fig.nvme_read_gbs is None
    try:
        w, r = host_figures.disk_bandwidth(str(tmp_path), 16 << 20)
        assert w > 0 and r > 0 and not list(tmp_path.iterdir())    # its file is gone
    except OSError as e:   # only a filesystem without O_DIRECT here; measure_host turns that into the error below
        assert e.errno == 22, e
    monkeypatch.setattr(host_figures, "disk_bandwidth", lambda *a: (_ for _ in ()).throw(OSError(22, "Invalid")))
    with pytest.raises(ValueError, match=r"O_DIRECT bandwidth measurement failed \(Invalid\); give the disk"):
        measure_host(str(tmp_path), host_gbs=10.0)
    monkeypatch.setattr(host_figures, "memory_filesystem_note", lambda path, key: f"{key}={path!r} is on tmpfs")
    with pytest.raises(ValueError, match="is on tmpfs"):
        measure_host(str(tmp_path), bandwidth=False)
