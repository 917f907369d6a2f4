"""Loss scalers: overflow patterns in, scales and skip decisions out, against DeepSpeed's documented rules.

Expected sequences are worked out by hand from REFERENCE.md §3.1 (halve after `hysteresis` overflows, double after
`loss_scale_window` clean steps counted from the last overflow, `min_loss_scale` floor).
"""
import logging

import pytest

from _deepspeed_cases import (GOLDEN_DEEPSPEED, HYSTERESIS, LOSS_SCALE_ARGS, deepspeed_traces, load_golden,
                              loss_scale_trace)
from dsfast.config import DsConfigError, load_config
from dsfast.precision import (DynamicLossScaler, LossScaleUnderflowError, NoOpLossScaler, StaticLossScaler,
                              build_loss_scaler)


def run(scaler, pattern):
    """Feed an overflow pattern ('O' overflow, '.' clean); return (scale used at each step, skipped flags)."""
    used, skipped = [], []
    for ch in pattern:
        overflow = ch == "O"
        used.append(scaler.loss_scale)
        skipped.append(overflow)      # the engine skips exactly the overflowing steps
        scaler.update_scale(overflow)
    return used, skipped


# ------------------------------------------------------------------------------------------------ building
def test_build_from_config():
    assert isinstance(build_loss_scaler(None), NoOpLossScaler)
    assert build_loss_scaler(None).loss_scale == 1.0
    assert isinstance(build_loss_scaler({"enabled": False}), NoOpLossScaler)
    static = build_loss_scaler({"enabled": True, "loss_scale": 128})
    assert isinstance(static, StaticLossScaler) and static.loss_scale == 128.0
    dyn = build_loss_scaler({"enabled": True})
    assert isinstance(dyn, DynamicLossScaler)
    # The documented defaults, also when ZeRO would be on (as DeepSpeed 0.19.8 passes them to its ZeRO path).
    assert (dyn.loss_scale, dyn.hysteresis, dyn.scale_window, dyn.min_scale, dyn.consecutive_hysteresis) == \
        (65536.0, 2, 1000, 1.0, False)
    cfg = load_config({"train_batch_size": 1, "fp16": {"enabled": True, "initial_scale_power": 8,
                                                       "loss_scale_window": 5, "hysteresis": 3,
                                                       "consecutive_hysteresis": True, "min_loss_scale": 2}})
    for source in (cfg, cfg.fp16):
        d = build_loss_scaler(source)
        assert (d.loss_scale, d.scale_window, d.hysteresis, d.consecutive_hysteresis, d.min_scale) == \
            (256.0, 5, 3, True, 2.0)
    with pytest.raises(DsConfigError, match="fp16.hysteresis"):
        build_loss_scaler({"enabled": True, "hysteresis": 0})
    with pytest.raises(TypeError):
        build_loss_scaler(3)


def test_bf16_and_static_never_change_scale():
    for scaler in (NoOpLossScaler(), StaticLossScaler(1024)):
        before = scaler.loss_scale
        used, skipped = run(scaler, "O.O..OO")
        assert used == [before] * 7 and skipped == [c == "O" for c in "O.O..OO"]
        assert scaler.overflow_count == 4


# ------------------------------------------------------------------------------------------------ hysteresis
def test_hysteresis2_not_consecutive():
    s = DynamicLossScaler(init_scale=1024, scale_window=1000, hysteresis=2, consecutive_hysteresis=False)
    # O: hysteresis 2->1, scale kept; '.': no refill; O: halve 1024->512; O: halve again (hysteresis stays 1)
    used, skipped = run(s, "O.OO.")
    assert used == [1024, 1024, 1024, 512, 256]
    assert skipped == [True, False, True, True, False]
    assert s.loss_scale == 256 and s.cur_hysteresis == 1


def test_hysteresis2_consecutive():
    s = DynamicLossScaler(init_scale=1024, scale_window=1000, hysteresis=2, consecutive_hysteresis=True)
    # O: 2->1; '.': refilled to 2; O: 2->1; O: halve (two in a row); '.': refill
    used, _ = run(s, "O.OO.O")
    assert used == [1024, 1024, 1024, 1024, 512, 512]
    assert s.loss_scale == 512 and s.cur_hysteresis == 1


def test_hysteresis3():
    s = DynamicLossScaler(init_scale=64, scale_window=1000, hysteresis=3)
    used, _ = run(s, "OOOO")
    assert used == [64, 64, 64, 32] and s.loss_scale == 16


# ------------------------------------------------------------------------------------------------ window
def test_growth_after_window_clean_steps_from_start():
    s = DynamicLossScaler(init_scale=8, scale_window=4, hysteresis=2)
    used, _ = run(s, "." * 9)
    # grows at the 4th clean step (cur_iter 3) and the 8th (cur_iter 7)
    assert used == [8, 8, 8, 8, 16, 16, 16, 16, 32]


def test_window_counted_from_last_overflow_and_refills_hysteresis():
    s = DynamicLossScaler(init_scale=64, scale_window=3, hysteresis=2)
    # iter0 O (hyst 2->1); iter1 O halve ->32 (last overflow 1); iters 2,3,4 clean: (4-1) % 3 == 0 -> 64, refill
    # iter5 O: hysteresis was refilled, so only 2->1; iter6 O: halve -> 32
    used, skipped = run(s, "OO...OO")
    assert used == [64, 64, 32, 32, 32, 64, 64]
    assert s.loss_scale == 32
    assert skipped == [True, True, False, False, False, True, True]


def test_window_one_doubles_every_clean_step():
    s = DynamicLossScaler(init_scale=4, scale_window=1, hysteresis=1)
    used, _ = run(s, "..O..")
    assert used == [4, 8, 16, 8, 16] and s.loss_scale == 32


def test_overflow_in_window_restarts_the_count():
    s = DynamicLossScaler(init_scale=16, scale_window=3, hysteresis=1)
    used, _ = run(s, "..O....")
    # two clean (no growth), overflow at iter 2 -> 8, then growth at iter 5 ((5-2) % 3 == 0)
    assert used == [16, 16, 16, 8, 8, 8, 16]


# ------------------------------------------------------------------------------------------------ floor
def test_floor_clamps_then_raises_with_history():
    s = DynamicLossScaler(init_scale=6, scale_window=1000, min_scale=4, hysteresis=1)
    s.update_scale(True)                      # 6/2 = 3 -> clamped to the floor 4
    assert s.loss_scale == 4
    with pytest.raises(LossScaleUnderflowError) as info:
        s.update_scale(True, step=41)
    msg = str(info.value)
    assert "step 41" in msg and "0 (scale 6)" in msg and "41 (scale 4)" in msg
    assert "min_loss_scale=4" in msg and "bf16" in msg and "learning rate" in msg
    assert s.recent_overflows == [0, 41]


def test_floor_with_hysteresis_uses_it_first():
    s = DynamicLossScaler(init_scale=2, scale_window=1000, min_scale=1, hysteresis=2)
    run(s, "OO")                             # 2->1 hysteresis, then halve to the floor 1
    assert s.loss_scale == 1
    with pytest.raises(LossScaleUnderflowError):
        s.update_scale(True)                 # hysteresis already spent (not refilled without clean window)


def test_floor_error_can_be_disabled():
    s = DynamicLossScaler(init_scale=1, min_scale=1, hysteresis=1, raise_error_at_min_scale=False)
    run(s, "OOO")
    assert s.loss_scale == 1


def test_history_is_bounded():
    s = DynamicLossScaler(init_scale=2.0 ** 40, hysteresis=1)
    run(s, "O" * 30)
    assert len(s.recent_overflows) == 16 and s.recent_overflows[-1] == 29


# ------------------------------------------------------------------------------------------------ state
def test_state_dict_round_trip_mid_sequence():
    pattern = "O..O....OO.O......O..."
    ref = DynamicLossScaler(init_scale=512, scale_window=3, hysteresis=2)
    ref_used, _ = run(ref, pattern)
    first = DynamicLossScaler(init_scale=512, scale_window=3, hysteresis=2)
    used_a, _ = run(first, pattern[:10])
    second = DynamicLossScaler(init_scale=512, scale_window=3, hysteresis=2)
    second.load_state_dict(first.state_dict())
    used_b, _ = run(second, pattern[10:])
    assert used_a + used_b == ref_used
    assert second.state_dict() == ref.state_dict()


# ------------------------------------------------------------------------------------------------ logging
def test_overflow_logged_once_on_rank0(caplog, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    s = DynamicLossScaler(init_scale=1024, hysteresis=2)
    with caplog.at_level(logging.INFO, logger="dsfast.precision"):
        run(s, "O.O")
    lines = [r.getMessage() for r in caplog.records if "OVERFLOW" in r.getMessage()]
    assert len(lines) == 2
    assert "Attempted loss scale: 1024, kept" in lines[0]
    assert "Attempted loss scale: 1024, reducing to 512" in lines[1]


def test_overflow_not_logged_on_other_ranks(caplog, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    s = DynamicLossScaler(init_scale=1024, hysteresis=1)
    with caplog.at_level(logging.INFO, logger="dsfast.precision"):
        run(s, "OO")
    assert not [r for r in caplog.records if "OVERFLOW" in r.getMessage()]


# ------------------------------------------------------------------------------------------------ DeepSpeed
# Against DeepSpeed 0.19.8's traces recorded in tests/data (always), and a live DeepSpeed when importable.
def our_loss_scale_traces():
    return {str(consecutive): loss_scale_trace(DynamicLossScaler(
                **LOSS_SCALE_ARGS, hysteresis=HYSTERESIS, consecutive_hysteresis=consecutive))
            for consecutive in (False, True)}


def test_matches_deepspeed_hysteresis_recorded():
    """Halving/hysteresis step by step, with and without consecutive_hysteresis (growth timing differs in 0.19)."""
    golden = load_golden("loss_scaler")
    assert our_loss_scale_traces() == golden
    # the recorded pattern exercises both rules: a kept overflow, halvings, and (consecutive) a restored count
    scales = [s for s, _ in golden["False"]]
    assert scales[0] == scales[1] and scales[-1] < scales[0] / 64
    assert golden["True"] != golden["False"] and max(h for _, h in golden["True"]) == HYSTERESIS


def test_matches_deepspeed_hysteresis_when_installed():
    deepspeed = pytest.importorskip("deepspeed")
    theirs = deepspeed_traces("loss_scaler")
    assert our_loss_scale_traces() == theirs
    if deepspeed.__version__ == GOLDEN_DEEPSPEED:
        assert theirs == load_golden("loss_scaler"), "stale golden file: rerun tests/data/make_deepspeed_goldens.py"
