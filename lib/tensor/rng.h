// rng.h: the counter-based RNG (Philox-4x32-10) behind parameter initialisation and dropout. A value
// is a pure function of (key, counter), so every rank and both backends draw the same number for the
// same global element, whatever the TP/PP/DP split (shared/DESIGN.md principle 4).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD inline
#endif

namespace mt {

struct Philox4 {
  uint32_t v[4];
};

MT_HD Philox4 philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Uniform in (0, 1).
MT_HD float uint_to_unit(uint32_t x) { return (static_cast<float>(x >> 8) + 0.5f) * (1.0f / 16777216.0f); }

// Standard normal for element `index` of stream `key` (Box-Muller on one Philox block).
MT_HD float philox_normal(uint64_t key, uint64_t index, uint64_t stream = 0) {
  const Philox4 r = philox4x32(index, stream, key);
  const float u1 = uint_to_unit(r.v[0]);
  const float u2 = uint_to_unit(r.v[1]);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

MT_HD float philox_uniform(uint64_t key, uint64_t index, uint64_t stream = 0) {
  return uint_to_unit(philox4x32(index, stream, key).v[0]);
}

// 64-bit FNV-1a then a splitmix finaliser: a key from the seed and a name.
inline uint64_t rng_key(uint64_t seed, std::string_view name) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace mt
