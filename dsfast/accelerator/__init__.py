"""DeepSpeed's accelerator abstraction (`from deepspeed.accelerator import get_accelerator`) for CUDA and CPU."""
from .base import Accelerator, DeepSpeedAccelerator
from .cpu import CpuAccelerator
from .cuda import CudaAccelerator
from .select import (SUPPORTED, AcceleratorError, get_accelerator, is_current_accelerator_supported,
                     select_accelerator, set_accelerator)

# DeepSpeed's class names, for programs that construct one directly
CPU_Accelerator = CpuAccelerator
CUDA_Accelerator = CudaAccelerator

__all__ = ["get_accelerator", "set_accelerator", "is_current_accelerator_supported", "select_accelerator",
           "Accelerator", "DeepSpeedAccelerator", "CpuAccelerator", "CudaAccelerator", "CPU_Accelerator",
           "CUDA_Accelerator", "AcceleratorError", "SUPPORTED"]
