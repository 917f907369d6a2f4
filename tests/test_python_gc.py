"""disable_python_gc as DeepSpeed 0.19.8 (runtime/python_gc.py) defines it: once an engine is built, one gc.collect()
and automatic cyclic collection off; on when the last such engine is destroyed; left as the program had it when it
was already off; a forked child starts with collection on; engine.collect_python_gc() collects on demand."""
import gc
import os

import pytest
import torch

import dsfast
from dsfast.engine import python_gc


def _engine(disable=True):
    model = torch.nn.Linear(3, 2)
    return dsfast.initialize(model=model, model_parameters=model.parameters(), dist_init_required=False,
                             config={"train_micro_batch_size_per_gpu": 1, "disable_python_gc": disable,
                                     "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})[0]


@pytest.fixture(autouse=True)
def gc_restored():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_off_while_the_engine_lives_after_one_collection(monkeypatch):
    calls = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or real(*a))
    engine = _engine()
    assert not gc.isenabled() and len(calls) == 1
    x = torch.randn(4, 3)
    engine.backward(engine(x).sum())
    engine.step()
    assert not gc.isenabled() and len(calls) == 1      # training does not collect
    assert isinstance(engine.collect_python_gc(), int) and len(calls) == 2 and not gc.isenabled()
    engine.destroy()
    assert gc.isenabled()
    engine.destroy()                                   # a second destroy changes nothing
    assert gc.isenabled()


def test_two_engines_share_one_hold():
    a, b = _engine(), _engine()
    assert python_gc.HOLD.engines == 2
    a.destroy()
    assert not gc.isenabled()
    b.destroy()
    assert gc.isenabled() and python_gc.HOLD.engines == 0


def test_already_off_stays_off_and_false_leaves_it_alone():
    gc.disable()
    e = _engine()
    e.destroy()
    assert not gc.isenabled()                          # the program turned it off: it stays off
    gc.enable()
    e = _engine(disable=False)
    assert gc.isenabled() and python_gc.HOLD.engines == 0
    e.destroy()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_collection_back():
    engine = _engine()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its parent's engine holds nothing here
        try:
            engine.destroy()                           # must not count against the child's (empty) hold
            os.write(write, b"%d%d" % (gc.isenabled(), python_gc.HOLD.engines))
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 8)
    os.waitpid(pid, 0)
    assert got == b"10"
    assert not gc.isenabled()                          # the parent's hold is untouched
    engine.destroy()
    assert gc.isenabled()


def test_an_engine_dropped_without_destroy_gives_it_back_when_collected():
    engine = _engine()
    assert not gc.isenabled()
    del engine          # its hooks hold it in reference cycles: an explicit collection frees it (DeepSpeed's __del__)
    gc.collect()
    assert gc.isenabled() and python_gc.HOLD.engines == 0
