// The unmodified csrc/cuda/scale.cu, compiled by the host compiler for the CPU emulation.
#include "scale.cu"
