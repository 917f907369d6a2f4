// The unmodified csrc/cuda/norm.cu, compiled by the host compiler for the CPU emulation.
#include "norm.cu"
