"""Bounded meetings of all ranks through the process group's key-value store (never a collective that can hang).

Each save is one numbered meeting; at each phase a rank posts a value under its own key and waits, at most
timeout_s, for the keys it needs. A rank that never calls save_checkpoint (DeepSpeed's classic hang: the call under
`if rank == 0`) makes the waiting ranks fail with CheckpointTimeoutError naming the missing ranks.
"""
import datetime
import itertools
import os
import threading

import torch.distributed as dist

from ..comm import where
from .errors import CheckpointTimeoutError

DEFAULT_TIMEOUT_S = 300.0
ENV_TIMEOUT = "DSFAST_CHECKPOINT_TIMEOUT_S"
_SAVES = itertools.count()


def resolve_timeout(config=None, override=None):
    """override (an argument) > $DSFAST_CHECKPOINT_TIMEOUT_S > config checkpoint.timeout_s > 300 s."""
    if override is not None:
        return float(override)
    env = os.environ.get(ENV_TIMEOUT)
    if env:
        try:
            value = float(env)
        except ValueError:
            raise ValueError(f"{ENV_TIMEOUT}={env!r} is not a number of seconds") from None
        if not value > 0:
            raise ValueError(f"{ENV_TIMEOUT}={env!r} must be > 0")
        return value
    ckpt = getattr(config, "checkpoint", None)
    return float(getattr(ckpt, "timeout_s", DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S)


class Meeting:
    """One save's exchanges among all ranks of the default process group (a world of one needs no store)."""

    def __init__(self, timeout_s, what="save_checkpoint"):
        self.timeout_s = float(timeout_s)
        self.what = what
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        self.prefix = f"dsfast/ckpt/{next(_SAVES)}/"
        self.store = dist.distributed_c10d._get_default_store() if self.distributed else None

    def _at(self, phase):
        # the hang watch follows the main thread: an async save's commit runs in its own thread beside training
        if threading.current_thread() is threading.main_thread():
            where.at(("checkpoint", self.what, phase))

    def _done(self):
        if threading.current_thread() is threading.main_thread():
            where.done()

    def _lost(self, phase, err):
        return CheckpointTimeoutError(
            f"{self.what} on rank {self.rank}: lost the process group's store at step {phase!r} "
            f"({type(err).__name__}: {str(err).splitlines()[0][:200]}); the rank hosting it (rank 0, MASTER_ADDR) "
            "has most likely died")

    def _set(self, phase, value):
        try:
            self.store.set(self._key(phase, self.rank), value)
        except Exception as err:   # DistNetworkError: the store's host is gone
            raise self._lost(phase, err) from None

    def _key(self, phase, rank):
        return f"{self.prefix}{phase}/{rank}"

    def _wait(self, phase, ranks):
        keys = [self._key(phase, r) for r in ranks]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        except Exception as err:   # torch raises DistStoreError on timeout, DistNetworkError if the host died
            try:
                missing = [r for r, k in zip(ranks, keys) if not self.store.check([k])]
            except Exception:
                raise self._lost(phase, err) from None
            if not missing:
                return self._get_all(phase, keys)
            raise CheckpointTimeoutError(
                f"{self.what} on rank {self.rank}: rank(s) {', '.join(map(str, missing))} did not reach step "
                f"{phase!r} within {self.timeout_s:g} s. Every rank must call {self.what} (calling it under "
                "`if rank == 0` is the usual cause), or a rank died or is still busy; raise checkpoint.timeout_s "
                f"(config) or ${ENV_TIMEOUT} for very slow disks") from None
        return self._get_all(phase, keys)

    def _get_all(self, phase, keys):
        try:
            return [self.store.get(k) for k in keys]
        except Exception as err:
            raise self._lost(phase, err) from None

    def all_gather(self, phase, value: bytes):
        """Every rank's value, in rank order."""
        if not self.distributed:
            return [value]
        self._at(phase)
        self._set(phase, value)
        values = self._wait(phase, range(self.world))
        self._done()
        return values

    def gather(self, phase, value: bytes):
        """Rank 0 gets every rank's value; the others get None (they do not wait)."""
        if not self.distributed:
            return [value]
        self._at(phase)
        self._set(phase, value)
        values = self._wait(phase, range(self.world)) if self.rank == 0 else None
        self._done()
        return values

    def broadcast(self, phase, value: bytes = None):
        """Rank 0's value on every rank."""
        if not self.distributed:
            return value
        self._at(phase)
        if self.rank == 0:
            self._set(phase, value)
        else:
            value = self._wait(phase, [0])[0]
        self._done()
        return value
