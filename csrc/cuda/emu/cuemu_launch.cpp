// cuemu's launches: the device limits checked, the blocks ordered (forward, reverse or random with
// a seed) and spread over OS threads, the first error rethrown; also the order settings and the
// record of launch sizes (cuemu_runtime.h).
#include "cuemu_runtime.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace cuemu {
namespace detail {

Settings::Settings() {
  if (const char* o = std::getenv("CUEMU_ORDER")) {
    std::string s(o);
    order = s == "reverse" ? Order::kReverse : s == "random" ? Order::kRandom : Order::kForward;
  }
  if (const char* s = std::getenv("CUEMU_SEED")) seed = std::strtoull(s, nullptr, 10);
  if (const char* w = std::getenv("CUEMU_WORKERS")) workers = std::atoi(w);
}

Settings& cfg() {
  static Settings s;
  return s;
}

namespace {

constexpr unsigned kMaxBlockX = 1024, kMaxBlockY = 1024, kMaxBlockZ = 64;
constexpr unsigned kMaxGridX = 2147483647u, kMaxGridYZ = 65535;
constexpr size_t kMaxParamBytes = 32764;
constexpr size_t kMaxDynamicSmem = 48 * 1024;  // without cudaFuncSetAttribute's opt-in

std::mutex& sizes_mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, int>& sizes() {
  static std::map<std::string, int> m;
  return m;
}

}  // namespace
}  // namespace detail

using namespace detail;

std::string launch_sizes() {
  std::lock_guard<std::mutex> g(sizes_mu());
  std::string out;
  for (const auto& kv : sizes()) out += kv.first + " " + std::to_string(kv.second) + "\n";
  return out;
}

void set_order(Order order, uint64_t seed) {
  cfg().order = order;
  cfg().seed = seed;
}
void set_workers(int workers) { cfg().workers = workers; }
Order order() { return cfg().order; }

void run(const LaunchSpec& spec) {
  const std::string at = where(spec.file, spec.line) + ": launch of " + spec.kernel + ": ";
  const dim3 g = spec.grid, bl = spec.block;
  auto bad = [&](const std::string& why) { throw Error(at + why); };
  if (bl.x == 0 || bl.y == 0 || bl.z == 0 || g.x == 0 || g.y == 0 || g.z == 0)
    bad("a grid or block dimension is 0 (grid " + idx3(uint3{g.x, g.y, g.z}) + ", block " + idx3(uint3{bl.x, bl.y, bl.z}) + ")");
  if (bl.x > kMaxBlockX || bl.y > kMaxBlockY || bl.z > kMaxBlockZ)
    bad("block " + idx3(uint3{bl.x, bl.y, bl.z}) + " exceeds the per-dimension limits (1024, 1024, 64)");
  if ((uint64_t)bl.x * bl.y * bl.z > (uint64_t)kMaxThreadsPerBlock)
    bad(std::to_string((uint64_t)bl.x * bl.y * bl.z) + " threads per block exceed the limit of 1024");
  if (g.x > kMaxGridX || g.y > kMaxGridYZ || g.z > kMaxGridYZ)
    bad("grid " + idx3(uint3{g.x, g.y, g.z}) + " exceeds the limits (2^31-1, 65535, 65535)");
  if (spec.param_bytes > kMaxParamBytes)
    bad(std::to_string(spec.param_bytes) + " bytes of kernel parameters exceed the limit of 32764");
  if (spec.smem > kMaxDynamicSmem)
    bad(std::to_string(spec.smem) + " bytes of dynamic shared memory exceed 48 KiB");

  {
    std::lock_guard<std::mutex> g(sizes_mu());
    int& most = sizes()[spec.kernel];
    most = std::max(most, int(bl.x * bl.y * bl.z));
  }
  Launch L;
  L.spec = spec;
  L.nthreads = int(bl.x * bl.y * bl.z);
  const uint64_t nblocks = (uint64_t)g.x * g.y * g.z;
  std::vector<uint64_t> order(nblocks);
  for (uint64_t i = 0; i < nblocks; ++i) order[i] = cfg().order == Order::kReverse ? nblocks - 1 - i : i;
  if (cfg().order == Order::kRandom) {
    std::mt19937_64 rng(cfg().seed ^ 0xC0FFEEull);
    std::shuffle(order.begin(), order.end(), rng);
  }
  std::atomic<uint64_t> next{0};
  auto worker = [&]() {
    Thread* saved = current;
    for (;;) {
      const uint64_t k = next.fetch_add(1);
      if (k >= nblocks || L.failed.load()) break;
      const uint64_t b = order[k];
      uint3 bidx{unsigned(b % g.x), unsigned((b / g.x) % g.y), unsigned(b / ((uint64_t)g.x * g.y))};
      run_block(L, bidx, b);
    }
    current = saved;
  };
  int workers = cfg().workers > 0 ? cfg().workers : (int)std::max(1u, std::thread::hardware_concurrency());
  workers = (int)std::min<uint64_t>(workers, nblocks);
  if (workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < workers; ++i) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (L.failed) throw Error(L.error);
}

}  // namespace cuemu
