// The unmodified csrc/cuda/adam.cu, compiled by the host compiler for the CPU emulation.
#include "adam.cu"
