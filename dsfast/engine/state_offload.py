"""engine.offload_states() / engine.reload_states(): the engine's model states off the device and back.

RLHF trainers (OpenRLHF, verl, ...) move a trainer's states to the host while an inference engine uses the GPU,
then bring them back. Here every device storage behind the chosen states (parameters, masters, gradients,
optimizer states, reduction buffers: what engine.memory_breakdown() counts, plus every module parameter) is
copied to host memory and then resized to nothing, so the device memory is free while every tensor object
(param.data views, optimizer.state entries, gradient views, cached kernel tables) stays the same object;
reload_states() gives each storage its bytes back and copies them in. Training after a round trip is bit-identical.

Unlike DeepSpeed 0.19.8 this works at every stage, with offload_param, and without an optimizer (a reference or
reward model: its parameters go). Shared-memory storages (same-host CPU ranks' reduction tables) are host memory
already and stay. On CPU ranks the "device" is the host, and the same copies run (the tests use that).
"""
import warnings

import torch

from ..runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum

# memory_breakdown categories -> DeepSpeed's state kinds
_KIND = {"params": OffloadStateTypeEnum.lp_params, "gathered": OffloadStateTypeEnum.lp_params,
         "masters": OffloadStateTypeEnum.hp_params, "grads": OffloadStateTypeEnum.lp_grads,
         "optimizer_states": OffloadStateTypeEnum.optim_states,
         "comm_buffers": OffloadStateTypeEnum.contiguous_grad_buffer}


class _Moved:
    """One device storage held on the host while offloaded."""

    def __init__(self, storage, host):
        self.storage, self.host, self.nbytes = storage, host, host.numel()


class StateOffload:
    """Mixed into dsfast's Engine."""

    _offloaded = None   # [ _Moved ] while the states are on the host

    def offload_states(self, include=None, device=OffloadDeviceEnum.cpu, pin_memory=True, non_blocking=False):
        """Move the chosen states (all by default: OffloadStateTypeEnum values or their names) to the host.
        non_blocking is accepted for DeepSpeed's signature: the device copies must land before the device memory
        is freed, so offloading always waits for them."""
        kinds = _kinds(include)
        where = OffloadDeviceEnum(device.value if isinstance(device, OffloadDeviceEnum) else str(device))
        if where == OffloadDeviceEnum.none:
            warnings.warn("engine.offload_states(device='none'): nothing to do")
            return
        if where == OffloadDeviceEnum.nvme:
            raise ValueError("engine.offload_states(device='nvme'): states can be moved to the host ('cpu') only")
        if self._offloaded is not None:
            raise RuntimeError("engine.offload_states(): the states are offloaded already; call "
                               "engine.reload_states() first")
        self._owner.settle()   # overlap_step: nothing writes the states while they move
        pin = bool(pin_memory) and torch.cuda.is_available()
        storages = self._state_storages(kinds)
        moved = []
        for st in storages:
            host = torch.empty(st.nbytes(), dtype=torch.uint8, pin_memory=pin)
            host.copy_(_bytes_of(st), non_blocking=pin)
            moved.append(_Moved(st, host))
        _synchronize(storages)
        for m in moved:
            m.storage.resize_(0)
        self._offloaded = moved

    def reload_states(self, non_blocking=False):
        """Give every offloaded storage its bytes back on the device (a no-op when nothing is offloaded)."""
        moved, self._offloaded = self._offloaded, None
        for m in moved or ():
            m.storage.resize_(m.nbytes)
            _bytes_of(m.storage).copy_(m.host, non_blocking=bool(non_blocking) and m.host.is_pinned())

    def require_states(self, what):
        if self._offloaded is not None:
            raise RuntimeError(f"engine.{what}(): the engine's states are offloaded (engine.offload_states()); call "
                               "engine.reload_states() first")

    def offloaded_tensors(self):
        """The host copies of offloaded states (engine.memory_breakdown() counts them as "offloaded")."""
        return [m.host for m in self._offloaded or ()]

    def _state_storages(self, kinds):
        device_type = self.device.type
        seen, out = set(), []

        def add(t):
            if not torch.is_tensor(t) or t.device.type != device_type:
                return
            st = t.untyped_storage()
            # a storage that cannot be resized is a mapping (the NVMe swap's host window): host memory already
            if st.nbytes() == 0 or st.is_shared() or not st.resizable() or st.data_ptr() in seen:
                return
            seen.add(st.data_ptr())
            out.append(st)
        for category, tensors in self._owner.memory_tensors().items():
            if _KIND.get(category, OffloadStateTypeEnum.contiguous_grad_buffer) in kinds:
                for t in tensors:
                    add(t)
        if OffloadStateTypeEnum.lp_params in kinds:   # every parameter: frozen ones too (a reference model)
            for p in self.module.parameters():
                add(p.data)
        return out


def _kinds(include):
    if include is None:
        return set(OffloadStateTypeEnum)
    out = set()
    for k in include:
        try:
            out.add(OffloadStateTypeEnum(k.value if isinstance(k, OffloadStateTypeEnum) else k))
        except ValueError:
            raise ValueError(f"engine.offload_states(include=...): {k!r} is not a state kind; valid: "
                             f"{', '.join(e.value for e in OffloadStateTypeEnum)}") from None
    return out


def _bytes_of(storage):
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, 0, (storage.nbytes(),))


def _synchronize(storages):
    for st in storages:
        if st.device.type == "cuda":
            torch.cuda.synchronize(st.device)
            return
