// The unmodified csrc/cuda/sgd.cu, compiled by the host compiler for the CPU emulation.
#include "sgd.cu"
