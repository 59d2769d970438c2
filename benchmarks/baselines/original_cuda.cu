// Clean-room CUDA baseline with the original's fixed launch geometry (docs/SPEC.md sections 1-3, 5),
// written from the specification only. It is a benchmark baseline, not part of tvm_canary:
//   verify : 64 blocks x 512 threads, grid-stride over the active entries; thread 0 bumps the kernel
//            counter before the enable check; per-warp sums of the active count go to the slot counter;
//            violation rows are appended by atomic arrival (SPEC 3.5; not in reference order).
//   write  : one block of one thread per request (grid = capacity); block 0 bumps the kernel counter.
//   plan   : one block computes the per-row lengths, both exclusive prefix sums, the write offsets and
//            seeds (the original does this in one Triton program of 4096 lanes; here 1024 threads x 4
//            rows, bs <= 4096); then a persistent grid of (SMs x 8) blocks x 128 threads writes the
//            entries, each finding its row by binary search in the verify offsets.
//   scatter: grid (bs, ceil(min(width, total) / 1024)), a 1024-column tile per block (256 threads x 4).
// Built with tvm-ffi's JIT (tvm_ffi.cpp.load_inline); the exported functions take the CUDA stream as
// their last argument.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace canary_original {

constexpr uint64_t kChainAnchor = 0xC0FFEE1234567890ULL;
constexpr int kMaxSources = 4;
constexpr int kModeNone = 0;
constexpr int kModePartial = 1;
constexpr int64_t kChainMismatch = 1 << 0;
constexpr int64_t kPositionMismatch = 1 << 1;
constexpr int64_t kRealKvMismatch = 1 << 2;
constexpr int64_t kWriteTokenMismatch = 1 << 3;
constexpr int64_t kWritePositionMismatch = 1 << 4;
constexpr int64_t kVerifyTokenMismatch = 1 << 5;
constexpr int kVerifyBlocks = 64;
constexpr int kVerifyThreads = 512;
constexpr int kPlanRowsPerThread = 4;
constexpr int kPlanOffsetThreads = 1024;
constexpr int kPlanEntryThreads = 128;
constexpr int kScatterTile = 1024;
constexpr int kScatterThreads = 256;

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = splitmix64(a);
  h = splitmix64(h ^ b);
  return splitmix64(h ^ c);
}

// Real-KV sources (SPEC 1.4, 2.6): byte base, row stride in bytes, page size, bytes per token, bytes
// folded in ALL mode.
struct Sources {
  const uint8_t* base[kMaxSources];
  int64_t row_bytes[kMaxSources];
  int64_t page_size[kMaxSources];
  int64_t token_bytes[kMaxSources];
  int64_t read_bytes[kMaxSources];
  int count;
  int mode;
};

__device__ __forceinline__ uint64_t fold_sources(const Sources& s, int64_t slot) {
  if (s.mode == kModeNone) return 0;
  uint64_t acc = 0;
  for (int i = 0; i < s.count; ++i) {
    const int64_t n = s.mode == kModePartial ? 16 : s.read_bytes[i];
    const int64_t row = slot / s.page_size[i];
    const int64_t col = (slot % s.page_size[i]) * s.token_bytes[i];
    const ulonglong2* strip = reinterpret_cast<const ulonglong2*>(s.base[i] + row * s.row_bytes[i] + col);
    uint64_t one = 0;
    for (int64_t w = 0; w < n / 16; ++w) {
      const ulonglong2 v = strip[w];
      one = splitmix64(one ^ v.x);
      one = splitmix64(one ^ v.y);
    }
    acc = splitmix64(acc ^ one);
  }
  return acc;
}

// The four fields of a slot (two 16-byte loads; the slot stride is a multiple of 16 bytes).
struct Slot {
  int64_t token, position, prev_hash, real_kv_hash;
};

__device__ __forceinline__ Slot load_slot(const uint8_t* canary, int64_t stride, int64_t slot) {
  const longlong2* p = reinterpret_cast<const longlong2*>(canary + slot * stride);
  const longlong2 a = p[0];
  const longlong2 b = p[1];
  return Slot{a.x, a.y, b.x, b.y};
}

__device__ __forceinline__ uint64_t slot_hash(const uint8_t* canary, int64_t stride, int64_t slot) {
  if (slot < 0) return splitmix64(kChainAnchor);
  const Slot s = load_slot(canary, stride, slot);
  return mix3(static_cast<uint64_t>(s.prev_hash), static_cast<uint64_t>(s.token), static_cast<uint64_t>(s.position));
}

__device__ __forceinline__ void atomic_add_i64(int64_t* p, int64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

__device__ void record(int64_t* ring, int64_t ring_rows, int32_t* write_index, const int64_t (&row)[8]) {
  const int k = atomicAdd(write_index, 1);
  if (k < ring_rows) {
    for (int f = 0; f < 8; ++f) ring[static_cast<int64_t>(k) * 8 + f] = row[f];
    __threadfence_system();
  }
}

struct Sink {
  int64_t* ring;
  int64_t ring_rows;
  int32_t* write_index;
  int64_t* slot_counter;
  int64_t* kernel_counter;
  int64_t kind;
};

template <bool kCheckToken>
__global__ void __launch_bounds__(kVerifyThreads) verify_kernel(
    const uint8_t* canary, int64_t stride, const int64_t* slots, const int64_t* expected_tokens,
    const int64_t* expected_positions, const int64_t* prev_slots, const int32_t* num_valid,
    const int32_t* enable, int64_t capacity, Sink sink, Sources sources) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid == 0) atomic_add_i64(sink.kernel_counter, 1);
  if (enable[0] == 0) return;
  const int64_t active = min(max(static_cast<int64_t>(num_valid[0]), int64_t{0}), capacity);
  int64_t counted = 0;
  for (int64_t k = tid; k < active; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    ++counted;
    const int64_t slot = slots[k];
    if (slot == 0) continue;
    const int64_t prev = prev_slots[k];
    const int64_t expected_token = kCheckToken ? expected_tokens[k] : -1;
    const Slot s = load_slot(canary, stride, slot);
    const int64_t expected_hash = prev != 0 ? static_cast<int64_t>(slot_hash(canary, stride, prev)) : s.prev_hash;
    const int64_t expected_real_kv = static_cast<int64_t>(fold_sources(sources, slot));
    int64_t bits = 0;
    if (prev != 0 && s.prev_hash != expected_hash) bits |= kChainMismatch;
    if (kCheckToken && expected_token != -1 && s.token != expected_token) bits |= kVerifyTokenMismatch;
    if (s.position != expected_positions[k]) bits |= kPositionMismatch;
    if (s.real_kv_hash != expected_real_kv) bits |= kRealKvMismatch;
    if (bits != 0) {
      const int64_t row[8] = {sink.kind, slot, s.position, s.token, expected_token, s.prev_hash, expected_hash, bits};
      record(sink.ring, sink.ring_rows, sink.write_index, row);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) counted += __shfl_down_sync(0xffffffffu, counted, offset);
  if ((threadIdx.x & 31) == 0 && counted != 0) atomic_add_i64(sink.slot_counter, counted);
}

template <bool kInputAssert>
__global__ void __launch_bounds__(1) write_kernel(
    uint8_t* canary, int64_t stride, const int64_t* offsets, const int64_t* seeds, const int32_t* num_valid_reqs,
    int64_t capacity, const int64_t* input_ids, const int64_t* positions, const int64_t* out_cache_loc,
    const int64_t* expected_tokens, const int64_t* expected_positions, const int32_t* chain_assert, Sink sink,
    Sources sources) {
  const int64_t r = blockIdx.x;
  if (r == 0) atomic_add_i64(sink.kernel_counter, 1);
  const int64_t active = min(max(static_cast<int64_t>(num_valid_reqs[0]), int64_t{0}), capacity);
  if (r >= active) return;
  const int64_t s0 = offsets[r];
  const int64_t s1 = offsets[r + 1];
  if (s1 - s0 <= 0) return;
  const int64_t seed = seeds[r];
  uint64_t h = slot_hash(canary, stride, seed);
  const bool check_position = seed >= 0 && chain_assert[0] != 0;
  int64_t prev_position = check_position ? load_slot(canary, stride, seed).position : 0;
  int64_t written = 0;
  for (int64_t i = s0; i < s1; ++i) {
    const int64_t slot = out_cache_loc[i];
    if (slot < 0) continue;
    const int64_t token = input_ids[i];
    const int64_t position = positions[i];
    const int64_t real_kv = static_cast<int64_t>(fold_sources(sources, slot));
    if (kInputAssert) {
      const int64_t et = expected_tokens[i];
      const int64_t ep = expected_positions[i];
      const int64_t bits = (token != et ? kWriteTokenMismatch : 0) | (position != ep ? kWritePositionMismatch : 0);
      if (bits != 0) {
        const int64_t row[8] = {sink.kind, slot, position, token, et, static_cast<int64_t>(h), ep, bits};
        record(sink.ring, sink.ring_rows, sink.write_index, row);
      }
    }
    if (check_position) {
      if (position != prev_position + 1) {
        const int64_t row[8] = {sink.kind, slot, position, token, token, static_cast<int64_t>(h), prev_position + 1,
                                kWritePositionMismatch};
        record(sink.ring, sink.ring_rows, sink.write_index, row);
      }
      prev_position = position;
    }
    longlong2* p = reinterpret_cast<longlong2*>(canary + slot * stride);
    p[0] = make_longlong2(token, position);
    p[1] = make_longlong2(static_cast<int64_t>(h), real_kv);
    h = mix3(h, static_cast<uint64_t>(token), static_cast<uint64_t>(position));
    ++written;
  }
  if (written != 0) atomic_add_i64(sink.slot_counter, written);
}

// Plan inputs shared by both plan kernels. lut / pool / valid_lens are null when absent.
struct PlanInputs {
  const int64_t* req_pool_indices;
  const int64_t* prefix_lens;
  const int64_t* extend_seq_lens;
  const int32_t* req_to_token;
  int64_t row_len;  // req_to_token.shape[1]
  int64_t bs;
  int64_t window;
  const int64_t* lut;
  int64_t lut_len;
  const int32_t* pool;
  int64_t pool_row_len;
  const int64_t* valid_lens;
  int64_t token_offset;
};

__device__ __forceinline__ int64_t translate(const PlanInputs& in, int64_t x) {
  if (in.lut == nullptr || x < 0) return x;
  return in.lut[min(x, in.lut_len - 1)];
}

__device__ __forceinline__ int64_t window_start(const PlanInputs& in, int64_t prefix) {
  return in.window > 0 ? max(int64_t{0}, prefix - in.window) : 0;
}

__global__ void __launch_bounds__(kPlanOffsetThreads) plan_offsets_kernel(
    PlanInputs in, int64_t* verify_offsets, int32_t* verify_num_valid, int32_t* verify_enable, int64_t verify_capacity,
    int64_t* write_offsets, int64_t* write_seeds, int64_t write_capacity, int32_t* write_num_valid_reqs) {
  __shared__ int64_t verify_sums[kPlanOffsetThreads];
  __shared__ int64_t write_sums[kPlanOffsetThreads];
  const int t = threadIdx.x;
  int64_t vlen[kPlanRowsPerThread];
  int64_t wlen[kPlanRowsPerThread];
  int64_t vsum = 0, wsum = 0;
  for (int j = 0; j < kPlanRowsPerThread; ++j) {
    const int64_t r = static_cast<int64_t>(t) * kPlanRowsPerThread + j;
    vlen[j] = wlen[j] = 0;
    if (r < in.bs && in.req_pool_indices[r] != 0) {
      const int64_t prefix = in.prefix_lens[r];
      vlen[j] = max(int64_t{0}, prefix - window_start(in, prefix));
      wlen[j] = in.extend_seq_lens[r] > 0 ? in.extend_seq_lens[r] : 0;
    }
    vsum += vlen[j];
    wsum += wlen[j];
  }
  verify_sums[t] = vsum;
  write_sums[t] = wsum;
  __syncthreads();
  for (int d = 1; d < kPlanOffsetThreads; d <<= 1) {  // inclusive scan (Hillis-Steele)
    const int64_t va = t >= d ? verify_sums[t - d] : 0;
    const int64_t wa = t >= d ? write_sums[t - d] : 0;
    __syncthreads();
    verify_sums[t] += va;
    write_sums[t] += wa;
    __syncthreads();
  }
  int64_t vrun = verify_sums[t] - vsum;
  int64_t wrun = write_sums[t] - wsum;
  for (int j = 0; j < kPlanRowsPerThread; ++j) {
    const int64_t r = static_cast<int64_t>(t) * kPlanRowsPerThread + j;
    if (r < in.bs) {
      verify_offsets[r] = vrun;
      write_offsets[r] = wrun;
      if (r < write_capacity) {
        int64_t seed = -1;
        const int64_t rp = in.req_pool_indices[r];
        if (rp != 0 && in.extend_seq_lens[r] > 0 && in.prefix_lens[r] > 0)
          seed = translate(in, in.req_to_token[rp * in.row_len + min(in.prefix_lens[r] - 1, in.row_len - 1)]);
        write_seeds[r] = seed;
      }
    }
    vrun += vlen[j];
    wrun += wlen[j];
  }
  if (t == kPlanOffsetThreads - 1) {
    const int64_t total = verify_sums[t];
    verify_offsets[in.bs] = total;
    write_offsets[in.bs] = write_sums[t];
    verify_num_valid[0] = static_cast<int32_t>(min(total, verify_capacity));
    verify_enable[0] = total <= verify_capacity ? 1 : 0;
    write_num_valid_reqs[0] = static_cast<int32_t>(in.bs);
  }
}

__global__ void __launch_bounds__(kPlanEntryThreads) plan_entries_kernel(
    PlanInputs in, const int64_t* verify_offsets, const int32_t* verify_enable, int64_t* slots, int64_t* expected_tokens,
    int64_t* expected_positions, int64_t* prev_slots) {
  const int64_t total = verify_offsets[in.bs];
  if (total <= 0 || verify_enable[0] == 0) return;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = in.bs - 1;  // largest r with verify_offsets[r] <= e
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (verify_offsets[mid] <= e) lo = mid; else hi = mid - 1;
    }
    const int64_t r = lo;
    const int64_t rp = in.req_pool_indices[r];
    const int64_t pos = window_start(in, in.prefix_lens[r]) + e - verify_offsets[r];
    const int32_t* row = in.req_to_token + rp * in.row_len;
    int64_t expected = -1;
    if (in.pool != nullptr) {
      const int64_t q = pos + in.token_offset;
      if (q >= 0 && q < in.valid_lens[r]) expected = in.pool[rp * in.pool_row_len + q];
    }
    slots[e] = translate(in, row[pos]);
    expected_tokens[e] = expected;
    expected_positions[e] = pos;
    prev_slots[e] = pos > 0 ? translate(in, row[pos - 1]) : -1;
  }
}

__global__ void __launch_bounds__(kScatterThreads) scatter_kernel(
    const int64_t* flat, int64_t n, const int64_t* offsets, const int64_t* req_pool_indices, int32_t* pool,
    int64_t width) {
  const int64_t r = blockIdx.x;
  const int64_t start = offsets[r];
  const int64_t length = min(offsets[r + 1] - start, width);
  const int64_t tile = static_cast<int64_t>(blockIdx.y) * kScatterTile;
  if (tile >= length) return;
  int32_t* out = pool + req_pool_indices[r] * width;
  for (int64_t c = tile + threadIdx.x; c < min(tile + kScatterTile, length); c += kScatterThreads) {
    const int64_t src = start + c;
    if (src >= 0 && src < n) out[c] = static_cast<int32_t>(flat[src]);
  }
}

}  // namespace canary_original

// ---------------------------------------------------------------------------------------------------
// Exported entry points (tvm-ffi). Tensors arrive zero-copy; the canary buffer and the sources as
// uint8 2-D tensors, everything else with the dtypes of SPEC section 2.

namespace {

using tvm::ffi::TensorView;
namespace co = canary_original;

template <typename T>
T* ptr(const TensorView& t) {
  return static_cast<T*>(t.data_ptr());
}

cudaStream_t as_stream(int64_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

// sources: four uint8 2-D tensors (unused ones: any tensor); params: CPU int64 [4, 4] of
// (page_size, num_bytes_per_token, read_bytes, row stride in bytes); count: sources in use; mode:
// RealKvHashMode.
co::Sources make_sources(const TensorView& s0, const TensorView& s1, const TensorView& s2, const TensorView& s3,
                         const TensorView& params, int64_t count, int64_t mode) {
  const TensorView* views[co::kMaxSources] = {&s0, &s1, &s2, &s3};
  const int64_t* p = ptr<const int64_t>(params);
  co::Sources out{};
  for (int i = 0; i < co::kMaxSources; ++i) {
    out.base[i] = ptr<const uint8_t>(*views[i]);
    out.page_size[i] = p[4 * i + 0] > 0 ? p[4 * i + 0] : 1;
    out.token_bytes[i] = p[4 * i + 1];
    out.read_bytes[i] = p[4 * i + 2];
    out.row_bytes[i] = p[4 * i + 3];
  }
  out.count = static_cast<int>(count);
  out.mode = count == 0 ? co::kModeNone : static_cast<int>(mode);
  return out;
}

co::Sink make_sink(const TensorView& ring, const TensorView& write_index, const TensorView& slot_counter,
                   const TensorView& kernel_counter, int64_t kind) {
  return co::Sink{ptr<int64_t>(ring), ring.shape()[0], ptr<int32_t>(write_index), ptr<int64_t>(slot_counter),
                  ptr<int64_t>(kernel_counter), kind};
}

}  // namespace

void original_verify(TensorView canary, TensorView slots, TensorView expected_tokens, TensorView expected_positions,
                     TensorView prev_slots, TensorView num_valid, TensorView enable, TensorView ring,
                     TensorView write_index, TensorView slot_counter, TensorView kernel_counter, int64_t kind,
                     bool check_token, TensorView s0, TensorView s1, TensorView s2, TensorView s3, TensorView params,
                     int64_t count, int64_t mode, int64_t stream) {
  const co::Sink sink = make_sink(ring, write_index, slot_counter, kernel_counter, kind);
  const co::Sources sources = make_sources(s0, s1, s2, s3, params, count, mode);
  auto kernel = check_token ? co::verify_kernel<true> : co::verify_kernel<false>;
  kernel<<<co::kVerifyBlocks, co::kVerifyThreads, 0, as_stream(stream)>>>(
      ptr<const uint8_t>(canary), canary.shape()[1], ptr<const int64_t>(slots), ptr<const int64_t>(expected_tokens),
      ptr<const int64_t>(expected_positions), ptr<const int64_t>(prev_slots), ptr<const int32_t>(num_valid),
      ptr<const int32_t>(enable), slots.shape()[0], sink, sources);
}

void original_write(TensorView canary, TensorView offsets, TensorView seeds, TensorView num_valid_reqs,
                    TensorView input_ids, TensorView positions, TensorView out_cache_loc, TensorView expected_tokens,
                    TensorView expected_positions, TensorView chain_assert, TensorView ring, TensorView write_index,
                    TensorView slot_counter, TensorView kernel_counter, int64_t kind, bool input_assert, TensorView s0,
                    TensorView s1, TensorView s2, TensorView s3, TensorView params, int64_t count, int64_t mode,
                    int64_t stream) {
  const co::Sink sink = make_sink(ring, write_index, slot_counter, kernel_counter, kind);
  const co::Sources sources = make_sources(s0, s1, s2, s3, params, count, mode);
  const int64_t capacity = seeds.shape()[0];
  auto kernel = input_assert ? co::write_kernel<true> : co::write_kernel<false>;
  kernel<<<static_cast<unsigned>(capacity > 0 ? capacity : 1), 1, 0, as_stream(stream)>>>(
      ptr<uint8_t>(canary), canary.shape()[1], ptr<const int64_t>(offsets), ptr<const int64_t>(seeds),
      ptr<const int32_t>(num_valid_reqs), capacity, ptr<const int64_t>(input_ids), ptr<const int64_t>(positions),
      ptr<const int64_t>(out_cache_loc), ptr<const int64_t>(expected_tokens), ptr<const int64_t>(expected_positions),
      ptr<const int32_t>(chain_assert), sink, sources);
}

// lut / pool / valid_lens are used only when has_lut / has_pool (otherwise any tensor may be passed).
void original_plan(TensorView slots, TensorView expected_tokens, TensorView expected_positions, TensorView prev_slots,
                   TensorView verify_num_valid, TensorView verify_enable, TensorView write_offsets,
                   TensorView write_seeds, TensorView write_num_valid_reqs, TensorView req_pool_indices,
                   TensorView prefix_lens, TensorView extend_seq_lens, TensorView req_to_token, int64_t window,
                   bool has_lut, TensorView lut, bool has_pool, TensorView pool, TensorView valid_lens,
                   int64_t token_offset, TensorView verify_offsets_scratch, int64_t num_sms, int64_t stream) {
  const co::PlanInputs in{ptr<const int64_t>(req_pool_indices),
                          ptr<const int64_t>(prefix_lens),
                          ptr<const int64_t>(extend_seq_lens),
                          ptr<const int32_t>(req_to_token),
                          req_to_token.shape()[1],
                          req_pool_indices.shape()[0],
                          window,
                          has_lut ? ptr<const int64_t>(lut) : nullptr,
                          lut.shape()[0],
                          has_pool ? ptr<const int32_t>(pool) : nullptr,
                          pool.ndim() == 2 ? pool.shape()[1] : 0,
                          has_pool ? ptr<const int64_t>(valid_lens) : nullptr,
                          token_offset};
  TVM_FFI_ICHECK(in.bs <= co::kPlanOffsetThreads * co::kPlanRowsPerThread) << "bs above 4096";
  cudaStream_t s = as_stream(stream);
  cudaMemsetAsync(write_offsets.data_ptr(), 0, write_offsets.numel() * sizeof(int64_t), s);
  co::plan_offsets_kernel<<<1, co::kPlanOffsetThreads, 0, s>>>(
      in, ptr<int64_t>(verify_offsets_scratch), ptr<int32_t>(verify_num_valid), ptr<int32_t>(verify_enable),
      slots.shape()[0], ptr<int64_t>(write_offsets), ptr<int64_t>(write_seeds), write_seeds.shape()[0],
      ptr<int32_t>(write_num_valid_reqs));
  co::plan_entries_kernel<<<static_cast<unsigned>(num_sms * 8), co::kPlanEntryThreads, 0, s>>>(
      in, ptr<const int64_t>(verify_offsets_scratch), ptr<const int32_t>(verify_enable), ptr<int64_t>(slots),
      ptr<int64_t>(expected_tokens), ptr<int64_t>(expected_positions), ptr<int64_t>(prev_slots));
}

void original_scatter(TensorView flat_in, TensorView offsets, TensorView req_pool_indices, TensorView pool_out,
                      int64_t stream) {
  const int64_t bs = req_pool_indices.shape()[0];
  const int64_t n = flat_in.shape()[0];
  const int64_t width = pool_out.shape()[1];
  if (bs == 0 || n == 0) return;
  const int64_t tiles = (std::min(width, n) + co::kScatterTile - 1) / co::kScatterTile;
  co::scatter_kernel<<<dim3(static_cast<unsigned>(bs), static_cast<unsigned>(tiles)), co::kScatterThreads, 0,
                       as_stream(stream)>>>(ptr<const int64_t>(flat_in), n, ptr<const int64_t>(offsets),
                                            ptr<const int64_t>(req_pool_indices), ptr<int32_t>(pool_out), width);
}
