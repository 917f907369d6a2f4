"""deepspeed.OnDevice / deepspeed.utils.OnDevice: build modules directly on a device (often "meta": shapes only,
no memory) and in a floating-point dtype.

    with OnDevice(dtype=torch.float16, device="meta"):
        model = BigModel()          # every floating parameter and buffer fp16, on the meta device

Tensors made inside the block without an explicit device go to `device`, floating ones without an explicit dtype
are `dtype` (torch's default-device context and default dtype, both restored on exit).
"""
import torch


class OnDevice:
    def __init__(self, dtype, device="meta", enabled=True):
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"OnDevice(dtype={dtype!r}): a floating-point torch dtype (or None to keep the default)")
        self.dtype, self.device, self.enabled = dtype, torch.device(device), enabled
        self._device_ctx, self._previous_dtype = None, None

    def __enter__(self):
        if not self.enabled:
            return self
        self._device_ctx = torch.device(self.device)
        self._device_ctx.__enter__()
        if self.dtype is not None:
            self._previous_dtype = torch.get_default_dtype()
            torch.set_default_dtype(self.dtype)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        if self._previous_dtype is not None:
            torch.set_default_dtype(self._previous_dtype)
            self._previous_dtype = None
        self._device_ctx.__exit__(*exc)
        self._device_ctx = None
        return False
