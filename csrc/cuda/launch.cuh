// One spelling of a kernel launch for both compilers: under nvcc DSFAST_LAUNCH(...)(args) is
// kernel<<<grid, block, smem, stream>>>(args); under a host compiler it is the CPU emulation's
// launch (csrc/cuda/emu, tests only), which also records this file and line for its errors.
// A kernel whose name has template arguments goes in parentheses: DSFAST_LAUNCH((k<A, B>), ...).
#pragma once

#if defined(__CUDACC__)
#define DSFAST_LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#else
#define DSFAST_LAUNCH(kernel, grid, block, smem, stream) \
  ::cuemu::launcher(__FILE__, __LINE__, #kernel, kernel, (grid), (block), (smem), (stream))
#endif
