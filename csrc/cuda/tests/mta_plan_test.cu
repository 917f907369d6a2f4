// Host-side test of the multi-tensor launcher's plan (no GPU needed): every element of every
// tensor is covered exactly once, blocks map to the right tensor, pointers and per-chunk output
// slots, launches split at the tensor capacity, and offsets stay right past 2^31 elements.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#include "../multi_tensor_apply.cuh"

using namespace dsfast::cuda;

static int failures = 0;
#define EXPECT(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) {                                          \
      ++failures;                                           \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);      \
      std::printf(__VA_ARGS__);                             \
      std::printf("\n");                                    \
    }                                                       \
  } while (0)

// Simulates every block of every launch; checks chunk coverage per tensor.
template <int Depth>
void check_plan(const std::vector<int64_t>& numel, const char* name) {
  const int64_t n = (int64_t)numel.size();
  std::vector<std::vector<void*>> ptrs(Depth, std::vector<void*>(n));
  for (int d = 0; d < Depth; ++d)
    for (int64_t t = 0; t < n; ++t) ptrs[d][t] = reinterpret_cast<void*>((uintptr_t)(1 + d * 1000003 + t) * 16);
  TensorLists<Depth> lists;
  lists.ntensors = n;
  lists.numel = numel.data();
  for (int d = 0; d < Depth; ++d) lists.ptrs[d] = ptrs[d].data();

  std::vector<int64_t> prefix(n + 1, 0);  // the norm kernel's per-chunk output slots
  for (int64_t t = 0; t < n; ++t) prefix[t + 1] = prefix[t] + (numel[t] + kChunkElems - 1) / kChunkElems;
  std::map<void*, int64_t> index_of;
  for (int64_t t = 0; t < n; ++t) index_of[ptrs[0][t]] = t;
  std::vector<int64_t> covered(n, 0), next_offset(n, 0);
  int64_t expected_slot = 0, launches = 0;
  plan_launches(lists, name, [&](const TensorListMeta<Depth>& m, int blocks) {
    ++launches;
    EXPECT(m.ntensors >= 1 && m.ntensors <= TensorListMeta<Depth>::kMaxTensors, "%s: ntensors %d", name,
           m.ntensors);
    EXPECT(m.chunk_offset == expected_slot, "%s: chunk_offset %lld != %lld", name, (long long)m.chunk_offset,
           (long long)expected_slot);
    for (int b = 0; b < blocks; ++b) {
      const ChunkRef r = locate_chunk(m, b);
      const auto found = index_of.find(m.addr[0][r.tensor]);  // pointers are unique per tensor
      const int64_t t = found == index_of.end() ? -1 : found->second;
      EXPECT(t >= 0 && t < n, "%s: tensor %lld out of range", name, (long long)t);
      if (t < 0 || t >= n) return;
      for (int d = 0; d < Depth; ++d) EXPECT(m.addr[d][r.tensor] == ptrs[d][t], "%s: wrong pointer", name);
      EXPECT(r.offset == next_offset[t], "%s: tensor %lld chunk at %lld, expected %lld", name, (long long)t,
             (long long)r.offset, (long long)next_offset[t]);
      EXPECT(r.n >= 1 && r.n <= kChunkElems && r.offset + r.n <= numel[t], "%s: bad chunk size %d", name, r.n);
      EXPECT(m.chunk_offset + b == prefix[t] + r.offset / kChunkElems, "%s: tensor %lld's output slot", name,
             (long long)t);
      next_offset[t] = r.offset + r.n;
      covered[t] += r.n;
    }
    expected_slot += blocks;
  });
  for (int64_t t = 0; t < n; ++t)
    EXPECT(covered[t] == numel[t], "%s: tensor %lld covered %lld of %lld", name, (long long)t,
           (long long)covered[t], (long long)numel[t]);
  std::printf("ok %s: %lld tensors, %lld launches, %lld chunks\n", name, (long long)n, (long long)launches,
              (long long)expected_slot);
}

struct CountBody {
  std::vector<int>* hits;
  template <int V>
  void step(int i) {
    for (int k = 0; k < V; ++k) (*hits)[i + k] += 1;
  }
};

template <int W>
void check_chunk_loop() {
  for (int n : {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 511, 512, 513, 4097, 65535, kChunkElems}) {
    for (bool aligned : {true, false}) {
      std::vector<int> hits(n, 0);
      CountBody body{&hits};
      for (int tid = 0; tid < kBlockThreads; ++tid) chunk_loop<W>(n, aligned, tid, kBlockThreads, body);
      for (int i = 0; i < n; ++i) EXPECT(hits[i] == 1, "chunk_loop<%d> n=%d aligned=%d: element %d hit %d times", W,
                                         n, (int)aligned, i, hits[i]);
    }
  }
  std::printf("ok chunk_loop<%d>\n", W);
}

int main() {
  check_plan<1>({1}, "one element");
  check_plan<5>({1, 7, 8, 17, 4097, kChunkElems, kChunkElems + 1, 3 * kChunkElems - 1}, "mixed sizes");
  check_plan<5>({0, 5, 0, 0, 70000, 0}, "empty tensors skipped");
  std::vector<int64_t> many(5000);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 1 + (int64_t)(i * 7919 % 300000);
  check_plan<6>(many, "5000 tensors over several launches");
  check_plan<4>({(1LL << 31) + 5, 3, (1LL << 32) + 65537}, "tensors past 2^31 elements");
  check_chunk_loop<1>();
  check_chunk_loop<4>();
  check_chunk_loop<8>();
  // Argument errors are exceptions with the op's name.
  TensorLists<1> bad;
  bad.ntensors = 1;
  int64_t neg = -1;
  void* p = &neg;
  void* const* pp = &p;
  bad.numel = &neg;
  bad.ptrs[0] = pp;
  bool threw = false;
  try {
    plan_launches(bad, "dsfast test", [](const TensorListMeta<1>&, int) {});
  } catch (const std::invalid_argument& e) {
    threw = std::string(e.what()).find("dsfast test: negative element count") != std::string::npos;
  }
  EXPECT(threw, "negative numel must throw");
  std::printf(failures ? "FAILED (%d)\n" : "all passed\n", failures);
  return failures ? 1 : 0;
}
