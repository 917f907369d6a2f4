// The emulator's own tests. Without arguments: every feature case, under forward, reverse and
// random order, prints "all passed". With a case name: runs that one strict-check case and
// prints the emulator's error (exit 3), or exits 0 if no error was raised (a failed check).
// Lines marked "// CHECK: <case>" are where the error must point (tests/test_cuda_emulator.py).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "launch.cuh"

namespace {

int failures = 0;
#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::printf("FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

// ---- feature kernels ----------------------------------------------------------------------------
__global__ void block_sum_kernel(const int* in, int* out, int n) {
  __shared__ int partial[1024];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  partial[threadIdx.x] = i < n ? in[i] : 0;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

struct WarpOut {
  int idx, up, down, xr, idx8, xr8;
  unsigned ballot;
  int any, all;
  int bar_or, bar_and, bar_count;
  double dbl;
};

__global__ void warp_kernel(WarpOut* out) {
  const int t = threadIdx.x, lane = t & 31;
  WarpOut o;
  o.idx = __shfl_sync(0xffffffffu, t * 10, 3);
  o.up = __shfl_up_sync(0xffffffffu, t, 2);
  o.down = __shfl_down_sync(0xffffffffu, t, 5);
  o.xr = __shfl_xor_sync(0xffffffffu, t, 7);
  o.idx8 = __shfl_sync(0xffffffffu, t, 1, 8);
  o.xr8 = __shfl_xor_sync(0xffffffffu, t, 12, 8);
  o.ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
  o.any = __any_sync(0xffffffffu, t == 37);
  o.all = __all_sync(0xffffffffu, lane < 31);
  __syncwarp();
  if (lane < 8) __syncwarp(0xffu);  // two groups with disjoint masks
  else __syncwarp(0xffffff00u);
  if (lane < 16) o.dbl = __shfl_down_sync(0x0000ffffu, 0.5 * t, 1, 16);  // a sub-warp group
  else o.dbl = __shfl_down_sync(0xffff0000u, 0.5 * t, 1, 16);
  o.bar_or = __syncthreads_or(t == 70);
  o.bar_and = __syncthreads_and(t < 1000);
  o.bar_count = __syncthreads_count(t % 4 == 0);
  out[blockIdx.x * blockDim.x + t] = o;
}

__global__ void atomic_kernel(int* counter, float* fsum, int* maxv, unsigned* cas_winner) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(counter, 1);
  atomicAdd(fsum, 0.5f);
  atomicMax(maxv, t);
  atomicCAS(cas_winner, 0xffffffffu, (unsigned)t);
}

__global__ void index_kernel(int* seen) {
  const int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int id = bx * (blockDim.x * blockDim.y * blockDim.z) + tx;
  atomicAdd(&seen[id], 1);
}

// Order-dependent on purpose: the last thread (block) to write wins.
__global__ void last_writer_kernel(int* last_thread, int* ticket, int* block_order) {
  __shared__ int last;
  last = threadIdx.x;  // a race: every thread writes
  __syncthreads();
  if (threadIdx.x == 0) {
    last_thread[blockIdx.x] = last;
    block_order[atomicAdd(ticket, 1)] = blockIdx.x;
  }
}

void feature_cases() {
  {
    const int n = 7 * 256 - 5;
    std::vector<int> in(n), out(7);
    std::iota(in.begin(), in.end(), -300);
    DSFAST_LAUNCH(block_sum_kernel, 7, 256, 0, nullptr)(in.data(), out.data(), n);
    for (int b = 0; b < 7; ++b) {
      long expect = 0;
      for (int i = b * 256; i < std::min(n, (b + 1) * 256); ++i) expect += in[i];
      EXPECT(out[b] == expect);
    }
  }
  {
    const int nt = 96;  // three warps
    std::vector<WarpOut> out(2 * nt);
    DSFAST_LAUNCH(warp_kernel, 2, nt, 0, nullptr)(out.data());
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < nt; ++t) {
        const WarpOut& o = out[b * nt + t];
        const int lane = t & 31, w0 = t - lane;
        EXPECT(o.idx == (w0 + 3) * 10);
        EXPECT(o.up == (lane >= 2 ? t - 2 : t));
        EXPECT(o.down == (lane + 5 < 32 ? t + 5 : t));
        EXPECT(o.xr == w0 + (lane ^ 7));
        EXPECT(o.idx8 == w0 + (lane & ~7) + 1);
        // lane ^ 12 leaves the 8-lane segment: an earlier segment is read, a later one gives the own value
        EXPECT(o.xr8 == ((lane ^ 12) <= (lane | 7) ? w0 + (lane ^ 12) : t));
        EXPECT(o.ballot == 0x49249249u);
        EXPECT(o.any == (t >= 32 && t < 64));
        EXPECT(o.all == 0);
        EXPECT(o.dbl == 0.5 * ((lane % 16) + 1 < 16 ? t + 1 : t));
        EXPECT(o.bar_or == 1 && o.bar_and == 1 && o.bar_count == nt / 4);
      }
  }
  {
    int counter = 0, maxv = -1;
    float fsum = 0.0f;
    unsigned winner = 0xffffffffu;
    DSFAST_LAUNCH(atomic_kernel, 9, 128, 0, nullptr)(&counter, &fsum, &maxv, &winner);
    EXPECT(counter == 9 * 128);
    EXPECT(fsum == 0.5f * 9 * 128);
    EXPECT(maxv == 9 * 128 - 1);
    EXPECT(winner < 9 * 128);
  }
  {
    std::vector<int> seen(2 * 3 * 2 * 4 * 2 * 3, 0);
    DSFAST_LAUNCH(index_kernel, dim3(2, 3, 2), dim3(4, 2, 3), 0, nullptr)(seen.data());
    for (int s : seen) EXPECT(s == 1);
  }
}

void order_cases() {
  const int nb = 6, nt = 64;
  auto run = [&](cuemu::Order o, uint64_t seed, std::vector<int>& last, std::vector<int>& order) {
    cuemu::set_order(o, seed);
    cuemu::set_workers(1);
    int ticket = 0;
    last.assign(nb, -1);
    order.assign(nb, -1);
    DSFAST_LAUNCH(last_writer_kernel, nb, nt, 0, nullptr)(last.data(), &ticket, order.data());
  };
  std::vector<int> l1, o1, l2, o2, l3, o3, l4, o4;
  run(cuemu::Order::kForward, 0, l1, o1);
  run(cuemu::Order::kReverse, 0, l2, o2);
  run(cuemu::Order::kRandom, 42, l3, o3);
  run(cuemu::Order::kRandom, 42, l4, o4);
  for (int b = 0; b < nb; ++b) {
    EXPECT(l1[b] == nt - 1);
    EXPECT(l2[b] == 0);
    EXPECT(o1[b] == b);
    EXPECT(o2[b] == nb - 1 - b);
  }
  EXPECT(l3 == l4 && o3 == o4);  // a seed reproduces its order
  bool differs = false;
  for (uint64_t seed = 1; seed < 8 && !differs; ++seed) {
    std::vector<int> l5, o5;
    run(cuemu::Order::kRandom, seed, l5, o5);
    differs = l5 != l3 || o5 != o3;
  }
  EXPECT(differs);
}

// ---- strict-check cases: each must fail with the file and line of its CHECK line ----------------
__global__ void exited_barrier_kernel(int* out) {
  if (threadIdx.x == 3) return;
  __syncthreads();  // CHECK: exited-barrier
  out[threadIdx.x] = 1;
}

__global__ void exited_shuffle_kernel(float* out) {
  if ((threadIdx.x & 31) == 5) return;
  float v = __shfl_xor_sync(0xffffffffu, 1.0f, 1);  // CHECK: exited-shuffle
  out[threadIdx.x] = v;
}

__global__ void different_barriers_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();  // CHECK: different-barriers
  } else {
    __syncthreads();  // CHECK: different-barriers
  }
  out[threadIdx.x] = 1;
}

__global__ void different_warp_ops_kernel(int* out) {
  int v = threadIdx.x;
  if ((threadIdx.x & 31) < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);  // CHECK: different-warp-ops
  else v = __shfl_down_sync(0xffffffffu, v, 1);  // CHECK: different-warp-ops
  out[threadIdx.x] = v;
}

__global__ void deadlock_kernel(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x != 0) v = __shfl_xor_sync(0xffffffffu, v, 1);  // CHECK: deadlock
  __syncthreads();  // CHECK: deadlock
  out[threadIdx.x] = v;
}

__global__ void mask_without_self_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, (int)threadIdx.x, 0);  // CHECK: mask-without-self
}

__global__ void reads_outside_mask_kernel(int* out) {
  if ((threadIdx.x & 31) < 16) out[threadIdx.x] = __shfl_sync(0xffffu, (int)threadIdx.x, 20);  // CHECK: reads-outside-mask
}

__global__ void tiny_kernel(int* out) { out[0] = 1; }

struct Big {
  char bytes[40000];
};
__global__ void big_param_kernel(Big b, int* out) { out[0] = b.bytes[0]; }

const std::map<std::string, std::function<void()>>& error_cases() {
  static std::vector<int> ibuf(4096);
  static std::vector<float> fbuf(4096);
  static const std::map<std::string, std::function<void()>> cases = {
      {"exited-barrier", [] { DSFAST_LAUNCH(exited_barrier_kernel, 2, 64, 0, nullptr)(ibuf.data()); }},
      {"exited-shuffle", [] { DSFAST_LAUNCH(exited_shuffle_kernel, 1, 64, 0, nullptr)(fbuf.data()); }},
      {"different-barriers", [] { DSFAST_LAUNCH(different_barriers_kernel, 1, 64, 0, nullptr)(ibuf.data()); }},
      {"different-warp-ops", [] { DSFAST_LAUNCH(different_warp_ops_kernel, 1, 32, 0, nullptr)(ibuf.data()); }},
      {"deadlock", [] { DSFAST_LAUNCH(deadlock_kernel, 1, 64, 0, nullptr)(ibuf.data()); }},  // CHECK: deadlock
      {"mask-without-self", [] { DSFAST_LAUNCH(mask_without_self_kernel, 1, 32, 0, nullptr)(ibuf.data()); }},
      {"reads-outside-mask", [] { DSFAST_LAUNCH(reads_outside_mask_kernel, 1, 32, 0, nullptr)(ibuf.data()); }},
      {"block-too-large", [] { DSFAST_LAUNCH(tiny_kernel, 1, dim3(64, 32), 0, nullptr)(ibuf.data()); }},  // CHECK: block-too-large
      {"block-z-too-large", [] { DSFAST_LAUNCH(tiny_kernel, 1, dim3(1, 1, 65), 0, nullptr)(ibuf.data()); }},  // CHECK: block-z-too-large
      {"grid-y-too-large", [] { DSFAST_LAUNCH(tiny_kernel, dim3(1, 70000), 32, 0, nullptr)(ibuf.data()); }},  // CHECK: grid-y-too-large
      {"empty-grid", [] { DSFAST_LAUNCH(tiny_kernel, 0, 32, 0, nullptr)(ibuf.data()); }},  // CHECK: empty-grid
      {"params-too-large", [] {
         static Big big{};
         DSFAST_LAUNCH(big_param_kernel, 1, 32, 0, nullptr)(big, ibuf.data());  // CHECK: params-too-large
       }},
  };
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const auto& cases = error_cases();
    auto it = cases.find(argv[1]);
    if (it == cases.end()) {
      std::printf("unknown case %s; cases:", argv[1]);
      for (const auto& c : cases) std::printf(" %s", c.first.c_str());
      std::printf("\n");
      return 2;
    }
    if (argc > 2) cuemu::set_order(std::strcmp(argv[2], "reverse") == 0 ? cuemu::Order::kReverse
                                   : std::strcmp(argv[2], "random") == 0 ? cuemu::Order::kRandom
                                                                         : cuemu::Order::kForward, 7);
    try {
      it->second();
    } catch (const cuemu::Error& e) {
      std::printf("%s\n", e.what());
      return 3;
    }
    std::printf("no error raised\n");
    return 0;
  }
  for (cuemu::Order o : {cuemu::Order::kForward, cuemu::Order::kReverse, cuemu::Order::kRandom}) {
    cuemu::set_order(o, 1234);
    cuemu::set_workers(2);
    feature_cases();
  }
  order_cases();
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("all passed\n");
  return 0;
}
