"""disable_python_gc: Python's cyclic garbage collector off while an engine that asks for it lives (DeepSpeed 0.19.8).

The first such engine runs one gc.collect() and turns automatic collection off, if it was on; the last one's
destroy() turns it back on. Engines count process-wide (two engines, e.g. a GAN's, share one hold). A forked child
starts with no engines: it gets collection back and its parent's engines cannot release anything there.
engine.collect_python_gc() collects at a point the program picks, without changing the setting.
"""
import gc
import os
import threading


class _GcHold:
    def __init__(self):
        self._lock = threading.RLock()
        self._engines = 0
        self._was_enabled = False
        self._generation = 0     # a fork starts a new one: holds taken before it do not count after it
        if hasattr(os, "register_at_fork"):
            # looked up at each fork: a child replaces its lock, and may fork again
            os.register_at_fork(before=lambda: self._lock.acquire(), after_in_parent=lambda: self._lock.release(),
                                after_in_child=self._after_fork_child)

    def _after_fork_child(self):
        if self._engines and self._was_enabled:
            gc.enable()
        self._engines, self._was_enabled = 0, False
        self._generation += 1
        self._lock = threading.RLock()   # the parent's was held across the fork

    def acquire(self):
        """Called by an engine with disable_python_gc; returns the token release() takes."""
        with self._lock:
            if self._engines == 0:
                self._was_enabled = gc.isenabled()
                if self._was_enabled:
                    gc.collect()
                    gc.disable()
            self._engines += 1
            return self._generation

    def release(self, token):
        with self._lock:
            if token != self._generation or self._engines == 0:
                return
            self._engines -= 1
            if self._engines == 0 and self._was_enabled:
                self._was_enabled = False
                gc.enable()

    @property
    def engines(self):
        return self._engines


HOLD = _GcHold()
