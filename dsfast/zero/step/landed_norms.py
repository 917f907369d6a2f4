"""Each shard unit's gradient norms, taken as its reduction lands at the accumulation boundary (issue 28): when
backward ends, the step's decision (decide.py) needs only its one all-reduce.

    norms = LandedNorms(store, stage)
    norms.landed(unit)          # the unit's gradient holds the window's reduced sum (the owner's landing callback)
    keyed = norms.keyed()       # ((param group, param, start), piece) of every unit, in DeepSpeed's order
    norms.for_step(keyed)       # their norms, or None when some unit's were not taken or its gradient changed since

The norms are the ones decide() would take at the step (clip_arith.piece_norms, its CPU exactness chosen once over
all of the rank's pieces), so the decision is bitwise the same. A gradient written after it landed (a late gradient,
a setter, a second reducing backward) bumps torch's version counter: its unit is measured again (landed again, or
by decide at the step).
"""
import torch

from .clip_arith import exact_cpu, piece_norms


class LandedNorms:
    def __init__(self, store, stage):
        self.store, self.stage = store, stage
        self.wanted = False   # the step reads norms (clipping or an overflow check): set by the owner's first step
        self._exact = exact_cpu([b - a for u in store.units for _, a, b, _ in store.pieces(u.plan)])
        self._at = {}         # unit index -> the gradient's version when its norms were taken
        self._norms = {}      # piece key -> its norm

    def _pieces(self, unit):
        return [((unit.plan.group, e.param, a), unit.grad[off:off + b - a])
                for e, a, b, off in self.store.pieces(unit.plan)]

    def keyed(self):
        out = [kt for u in self.store.units for kt in self._pieces(u)]
        out.sort(key=lambda kv: kv[0])
        return out

    @torch.no_grad()
    def landed(self, unit):
        if not self.wanted:
            return
        keyed = self._pieces(unit)
        for (key, _), n in zip(keyed, piece_norms([(key[0], t) for key, t in keyed], self.stage, self._exact)):
            self._norms[key] = n
        self._at[unit.index] = unit.grad._version

    def for_step(self, keyed):
        units = self.store.units
        if not all(self._at.get(u.index) == u.grad._version for u in units):
            return None
        return [self._norms[key] for key, _ in keyed]
