// sdpa_cudnn.cpp: the attention graphs for cuDNN's backend API. The op sequence follows what cuDNN's
// flash-attention fusion engines recognise (the same decomposition NVIDIA's frontend emits): no S x S
// tensor ever reaches memory; only O and the fp32 log-sum-exp statistics (forward), and the fp32 row
// sums of dO * O plus an fp32 dQ accumulator (backward) do.
#include "kernels/cuda/sdpa_cudnn.h"

#include <cudnn.h>

#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "kernels/cuda/attention_sink.h"
#include "kernels/cuda/dropout.h"
#include "tensor/cuda/cuda_check.h"
#include "tensor/cuda/device_allocator.h"

namespace mt::cuda {
namespace {

// cuDNN's message with its last-error string, for the reasons a graph is refused.
std::string cudnn_message(cudnnStatus_t s) {
  char buf[2048] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  return std::string(cudnnGetErrorString(s)) + (buf[0] ? std::string(" (") + buf + ")" : std::string());
}

using Desc = cudnnBackendDescriptor_t;
using Dims = std::array<int64_t, 4>;

Dims contiguous(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum, kOne, kBias,
  kSeed, kOffset, kDropScale, kDropScaleInv, kWindow, kSink
};

// One operation graph and its execution plan; owns every descriptor it made (the plan refers to them).
class Graph {
 public:
  explicit Graph(cudnnHandle_t h) : handle_(h) {}
  ~Graph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Desc make(cudnnBackendDescriptorType_t t) {
    Desc d = nullptr;
    MT_CUDNN_CHECK(cudnnBackendCreateDescriptor(t, &d));
    owned_.push_back(d);
    return d;
  }
  static void set(Desc d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t, int64_t n, const void* v) {
    MT_CUDNN_CHECK(cudnnBackendSetAttribute(d, a, t, n, v));
  }
  static void finalize(Desc d) { MT_CUDNN_CHECK(cudnnBackendFinalize(d)); }

  Desc tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides, bool is_virtual, bool by_value = false) {
    Desc d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    const int64_t align = 16;
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    const bool v = is_virtual;
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (by_value) {
      const bool b = true;
      set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &b);
    }
    finalize(d);
    return d;
  }
  Desc virt(cudnnDataType_t dt, const Dims& dims) { return tensor(next_uid_++, dt, dims, contiguous(dims), true); }
  Desc virt_strided(cudnnDataType_t dt, const Dims& dims, const Dims& strides) { return tensor(next_uid_++, dt, dims, strides, true); }
  Desc scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  void matmul(Desc a, Desc b, Desc c) {
    Desc m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct);
    finalize(m);
    Desc op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    finalize(op);
    ops_.push_back(op);
  }
  void pointwise(cudnnPointwiseMode_t mode, Desc x, Desc y, Desc b = nullptr, Desc t = nullptr, int64_t axis = -1,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT) {
    Desc pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw);
    Desc op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    finalize(op);
    ops_.push_back(op);
  }
  void reduction(cudnnReduceTensorOp_t r, Desc x, Desc y) {
    Desc rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r);
    const cudnnDataType_t ct = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct);
    finalize(rd);
    Desc op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    finalize(op);
    ops_.push_back(op);
  }
  void reshape(Desc x, Desc y) {
    Desc op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op);
    ops_.push_back(op);
  }
  // Causal mask on scores x ([.., row, col]): positions with col > row get the lowest float.
  Desc causal(Desc x, const Dims& dims, Desc neg_inf) {
    Desc row = virt(CUDNN_DATA_INT32, dims), col = virt(CUDNN_DATA_INT32, dims);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, row, nullptr, nullptr, 2, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, col, nullptr, nullptr, 3, CUDNN_DATA_INT32);
    Desc keep = virt(CUDNN_DATA_BOOLEAN, dims);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, nullptr, -1, CUDNN_DATA_BOOLEAN);
    Desc y = virt(CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, y, neg_inf, keep);
    return y;
  }

  // Sliding window on scores x (after the causal mask): positions with col + bound <= row get the lowest float, where
  // `bound` is the window + 1 as a by-value float (cuDNN's frontend's top-left sliding-window mask, its composite form:
  // the column index plus the bound in float, col + w > row keeps).
  Desc window(Desc x, const Dims& dims, Desc neg_inf, Desc bound) {
    Desc row = virt(CUDNN_DATA_INT32, dims), col = virt(CUDNN_DATA_INT32, dims);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, row, nullptr, nullptr, 2, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, col, nullptr, nullptr, 3, CUDNN_DATA_INT32);
    Desc shifted = virt(CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_ADD, col, shifted, bound, nullptr, 3, CUDNN_DATA_FLOAT);
    Desc keep = virt(CUDNN_DATA_BOOLEAN, dims);
    pointwise(CUDNN_POINTWISE_CMP_GT, shifted, keep, row, nullptr, -1, CUDNN_DATA_BOOLEAN);
    Desc y = virt(CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, y, neg_inf, keep);
    return y;
  }

  // Attention dropout's keep mask over `dims` (fp32 0 or 1): Bernoulli with probability `keep` from cuDNN's Philox
  // generator, seeded by the int64 device scalars `seed` and `offset`.
  Desc keep_mask(const Dims& dims, double keep, Desc seed, Desc offset) {
    Desc rng = make(CUDNN_BACKEND_RNG_DESCRIPTOR);
    const cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    set(rng, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &dist);
    set(rng, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep);
    finalize(rng);
    Desc y = virt(CUDNN_DATA_FLOAT, dims);
    Desc op = make(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RNG_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(op, CUDNN_ATTR_OPERATION_RNG_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rng);
    set(op, CUDNN_ATTR_OPERATION_RNG_SEED, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &seed);
    set(op, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &offset);
    finalize(op);
    ops_.push_back(op);
    return y;
  }
  Desc int64_scalar(int64_t uid) { return tensor(uid, CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1}, false); }

  // Finalizes the graph and the first execution plan an engine accepts; false (reason in `why`) if none.
  bool build(std::string* why) {
    Desc g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()), ops_.data());
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    cudnnStatus_t st = cudnnBackendFinalize(g);
    if (st != CUDNN_STATUS_SUCCESS) {
      *why = "operation graph: " + cudnn_message(st);
      return false;
    }
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Desc heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &g);
      set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
      st = cudnnBackendFinalize(heur);
      if (st != CUDNN_STATUS_SUCCESS) {
        *why = "heuristics: " + cudnn_message(st);
        continue;
      }
      int64_t count = 0;
      MT_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
      if (count == 0) {
        *why = "no engine configuration from the heuristics";
        continue;
      }
      std::vector<Desc> cfgs(static_cast<size_t>(count));
      for (auto& c : cfgs) c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      int64_t got = 0;
      MT_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs.data()));
      for (int64_t i = 0; i < got; ++i) {
        Desc plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[static_cast<size_t>(i)]);
        st = cudnnBackendFinalize(plan);
        if (st != CUDNN_STATUS_SUCCESS) {
          *why = "execution plan: " + cudnn_message(st);
          continue;
        }
        int64_t n = 0;
        MT_CUDNN_CHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &workspace_bytes_));
        plan_ = plan;
        return true;
      }
    }
    return false;
  }

  void execute(cudnnHandle_t h, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, void* workspace) const {
    Desc vp = nullptr;
    MT_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp));
    try {
      set(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
      set(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(ptrs.size()), ptrs.data());
      set(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
      finalize(vp);
      MT_CUDNN_CHECK(cudnnBackendExecute(h, plan_, vp));
    } catch (...) {
      cudnnBackendDestroyDescriptor(vp);
      throw;
    }
    cudnnBackendDestroyDescriptor(vp);
  }
  int64_t workspace_bytes() const { return workspace_bytes_; }

 private:
  cudnnHandle_t handle_;
  std::vector<Desc> owned_, ops_;
  Desc plan_ = nullptr;
  int64_t next_uid_ = 100;
  int64_t workspace_bytes_ = 0;
};

struct Layouts {
  Dims q_dims, q_str, kt_dims, kt_str, kv_dims, kv_str, stats_dims, stats_str, sum_str, s_dims, t_dims, t_str, bias_dims, bias_str, kq_dims;
  // The values' and the output's (their head dimension Dv: D but for multi-latent attention)
  Dims o_dims, o_str, v_dims, v_str, vt_dims, vt_str, vq_dims;
};

// S queries against Sk keys; a sample's rows q_stride() (kv_stride()) apart in the buffers.
Layouts layouts(const SdpaShape& s) {
  Layouts l{};
  const int64_t Sk = s.keys(), qr = s.q_stride(), kr = s.kv_stride();
  l.q_dims = {s.B, s.Hq, s.S, s.D};
  l.q_str = {qr * s.Hq * s.D, s.D, s.Hq * s.D, 1};
  l.kv_dims = {s.B, s.Hk, Sk, s.D};
  l.kv_str = {kr * s.Hk * s.D, s.D, s.Hk * s.D, 1};
  l.kt_dims = {s.B, s.Hk, s.D, Sk};
  l.kt_str = {kr * s.Hk * s.D, s.D, 1, s.Hk * s.D};
  l.stats_dims = {s.B, s.Hq, s.S, 1};
  l.stats_str = {s.Hq * qr, qr, 1, 1};
  l.sum_str = {s.Hq * s.S, s.S, 1, 1};  // (the backward's own softmax sums: contiguous)
  l.s_dims = {s.B, s.Hq, s.S, Sk};
  l.t_dims = {s.B, s.Hq, Sk, s.S};  // P^T and dS^T: strided views of the [.., S, Sk] tensors
  l.t_str = {s.Hq * s.S * Sk, s.S * Sk, 1, Sk};
  l.kq_dims = {s.B, s.Hq, Sk, s.D};  // dK per query head before GQA's sum over a group
  const int64_t Dv = s.value_dim();
  l.o_dims = {s.B, s.Hq, s.S, Dv};
  l.o_str = {qr * s.Hq * Dv, Dv, s.Hq * Dv, 1};
  l.v_dims = {s.B, s.Hk, Sk, Dv};
  l.v_str = {kr * s.Hk * Dv, Dv, s.Hk * Dv, 1};
  l.vt_dims = {s.B, s.Hk, Dv, Sk};
  l.vt_str = {kr * s.Hk * Dv, Dv, 1, s.Hk * Dv};
  l.vq_dims = {s.B, s.Hq, Sk, Dv};  // dV per query head before GQA's sum
  l.bias_dims = {s.B, 1, s.S, Sk};
  l.bias_str = {s.S * Sk, s.S * Sk, Sk, 1};
  return l;
}

std::unique_ptr<Graph> forward_graph(cudnnHandle_t h, const SdpaShape& s, bool p_bf16, std::string* why) {
  if (s.window >= 0 && !s.causal) {
    *why = "a sliding window needs the causal mask";
    return nullptr;
  }
  auto g = std::make_unique<Graph>(h);
  const Layouts l = layouts(s);
  const cudnnDataType_t bf = s.type == F16::kFP16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
  Desc q = g->tensor(kQ, bf, l.q_dims, l.q_str, false);
  Desc kt = g->tensor(kK, bf, l.kt_dims, l.kt_str, false);
  Desc v = g->tensor(kV, bf, l.v_dims, l.v_str, false);
  Desc o = g->tensor(kO, bf, l.o_dims, l.o_str, false);
  Desc stats = g->tensor(kStats, f, l.stats_dims, l.stats_str, false);
  Desc scale = g->scalar(kScale), neg = s.causal ? g->scalar(kNegInf) : nullptr;
  Desc sc = g->virt(f, l.s_dims);
  g->matmul(q, kt, sc);
  Desc scaled = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_MUL, sc, scaled, scale);
  if (s.bias) {  // (as cuDNN's frontend places a bias: onto the scaled scores, before the masks)
    Desc bias = g->tensor(kBias, bf, l.bias_dims, l.bias_str, false);
    Desc biased = g->virt(f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_ADD, scaled, biased, bias);
    scaled = biased;
  }
  Desc masked = s.causal ? g->causal(scaled, l.s_dims, neg) : scaled;
  if (s.window >= 0) masked = g->window(masked, l.s_dims, neg, g->scalar(kWindow));
  Desc mx = g->virt(f, l.stats_dims);
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, masked, mx);
  // Sinks (as cuDNN's frontend lowers its sink token): the row maximum with the head's sink logit, and exp(sink - max)
  // added to the denominator, so that the statistics carry it.
  Desc sink = s.sink ? g->tensor(kSink, f, {1, s.Hq, 1, 1}, {s.Hq, 1, 1, 1}, false) : nullptr;
  if (sink) {
    Desc mx_sink = g->virt(f, l.stats_dims);
    g->pointwise(CUDNN_POINTWISE_MAX, mx, mx_sink, sink);
    mx = mx_sink;
  }
  Desc sub = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_SUB, masked, sub, mx);
  Desc e = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_EXP, sub, e);
  Desc z = g->virt(f, l.stats_dims);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  if (sink) {
    Desc sink_sub = g->virt(f, l.stats_dims), sink_exp = g->virt(f, l.stats_dims), z_sink = g->virt(f, l.stats_dims);
    g->pointwise(CUDNN_POINTWISE_SUB, sink, sink_sub, mx);
    g->pointwise(CUDNN_POINTWISE_EXP, sink_sub, sink_exp);
    g->pointwise(CUDNN_POINTWISE_ADD, z, z_sink, sink_exp);
    z = z_sink;
  }
  Desc lz = g->virt(f, l.stats_dims);
  g->pointwise(CUDNN_POINTWISE_LOG, z, lz);
  g->pointwise(CUDNN_POINTWISE_ADD, mx, stats, lz);
  const bool drop = s.dropout > 0;
  Desc p = g->virt(p_bf16 && !drop ? bf : f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_DIV, e, p, z);
  if (drop) {  // (as cuDNN's frontend: the mask, then the scale 1 / (1 - p) into the matmul's type)
    Desc mask = g->keep_mask(l.s_dims, 1.0 - s.dropout, g->int64_scalar(kSeed), g->int64_scalar(kOffset));
    Desc kept = g->virt(f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_MUL, p, kept, mask);
    Desc scaled_kept = g->virt(p_bf16 ? bf : f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_MUL, kept, scaled_kept, g->scalar(kDropScale));
    p = scaled_kept;
  }
  g->matmul(p, v, o);
  if (!g->build(why)) return nullptr;
  return g;
}

std::unique_ptr<Graph> backward_graph(cudnnHandle_t h, const SdpaShape& s, bool deterministic, std::string* why) {
  if (s.window >= 0 && !s.causal) {
    *why = "a sliding window needs the causal mask";
    return nullptr;
  }
  auto g = std::make_unique<Graph>(h);
  const Layouts l = layouts(s);
  const cudnnDataType_t bf = s.type == F16::kFP16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16, f = CUDNN_DATA_FLOAT;
  Desc q = g->tensor(kQ, bf, l.q_dims, l.q_str, false);
  Desc kt = g->tensor(kK, bf, l.kt_dims, l.kt_str, false);
  Desc vt = g->tensor(kV, bf, l.vt_dims, l.vt_str, false);  // V^T: a strided view, as K^T
  Desc o = g->tensor(kO, bf, l.o_dims, l.o_str, false);
  Desc d_o = g->tensor(kDO, bf, l.o_dims, l.o_str, false);
  Desc stats = g->tensor(kStats, f, l.stats_dims, l.stats_str, false);
  Desc dq = g->tensor(kDQ, bf, l.q_dims, l.q_str, false);
  Desc dk = g->tensor(kDK, bf, l.kv_dims, l.kv_str, false);
  Desc dv = g->tensor(kDV, bf, l.v_dims, l.v_str, false);
  Desc scale = g->scalar(kScale), neg = s.causal ? g->scalar(kNegInf) : nullptr;
  Desc softmax_sum = g->tensor(kSoftmaxSum, f, l.stats_dims, l.sum_str, false);
  Desc dq_accum = deterministic ? nullptr : g->tensor(kDQAccum, f, l.q_dims, contiguous(l.q_dims), false);
  const bool gqa = s.Hq != s.Hk, drop = s.dropout > 0;
  // Dropout (as cuDNN's frontend spells it): m the forward's keep mask, r = 1 / (1 - p). O = (P m r) V, so with
  // dP' = dO V^T, dS = P (m dP' r - rowsum(dO O)) = (m dP' - (1 - p) rowsum(dO O)) P r.
  Desc mask = drop ? g->keep_mask(l.s_dims, 1.0 - s.dropout, g->int64_scalar(kSeed), g->int64_scalar(kOffset)) : nullptr;
  Desc drop_scale = drop ? g->scalar(kDropScale) : nullptr;
  // softmax_sum = rowsum(dO * O) (times 1 - p under dropout)
  Desc doo = g->virt_strided(f, l.o_dims, l.o_str);
  g->pointwise(CUDNN_POINTWISE_MUL, d_o, doo, o);
  Desc rs = g->virt(f, l.stats_dims);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, doo, rs);
  g->pointwise(CUDNN_POINTWISE_MUL, rs, softmax_sum, g->scalar(drop ? kDropScaleInv : kOne));
  // P = exp(mask(scale * Q K^T) - stats)
  Desc sc = g->virt(f, l.s_dims);
  g->matmul(q, kt, sc);
  Desc scaled = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_MUL, sc, scaled, scale);
  if (s.bias) {
    Desc bias = g->tensor(kBias, bf, l.bias_dims, l.bias_str, false);
    Desc biased = g->virt(f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_ADD, scaled, biased, bias);
    scaled = biased;
  }
  Desc shifted = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_SUB, scaled, shifted, stats);
  Desc masked = s.causal ? g->causal(shifted, l.s_dims, neg) : shifted;
  if (s.window >= 0) masked = g->window(masked, l.s_dims, neg, g->scalar(kWindow));
  Desc p = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_EXP, masked, p);
  // dV = P^T dO (summed over the heads of a group under GQA; P m r under dropout)
  Desc p_used = p;
  if (drop) {
    Desc kept = g->virt(f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_MUL, p, kept, mask);
    p_used = g->virt(f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_MUL, kept, p_used, drop_scale);
  }
  Desc pt = g->virt_strided(bf, l.t_dims, l.t_str);
  g->reshape(p_used, pt);
  if (!gqa) {
    g->matmul(pt, d_o, dv);
  } else {
    Desc dv_full = g->virt(bf, l.vq_dims);
    g->matmul(pt, d_o, dv_full);
    g->reduction(CUDNN_REDUCE_TENSOR_ADD, dv_full, dv);
  }
  // dS = scale * P * (dO V^T - softmax_sum)
  Desc dp = g->virt(f, l.s_dims);
  g->matmul(d_o, vt, dp);
  if (drop) {
    Desc dp_kept = g->virt(f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_MUL, dp, dp_kept, mask);
    dp = dp_kept;
  }
  Desc dp1 = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_SUB, dp, dp1, softmax_sum);
  Desc dp2 = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_MUL, dp1, dp2, p);
  if (drop) {
    Desc dp3 = g->virt(f, l.s_dims);
    g->pointwise(CUDNN_POINTWISE_MUL, dp2, dp3, drop_scale);
    dp2 = dp3;
  }
  Desc ds = g->virt(f, l.s_dims);
  g->pointwise(CUDNN_POINTWISE_MUL, dp2, ds, scale);
  // dK = dS^T Q
  Desc dst = g->virt_strided(bf, l.t_dims, l.t_str);
  g->reshape(ds, dst);
  if (!gqa) {
    g->matmul(dst, q, dk);
  } else {
    Desc dk_full = g->virt(bf, l.kq_dims);
    g->matmul(dst, q, dk_full);
    g->reduction(CUDNN_REDUCE_TENSOR_ADD, dk_full, dk);
  }
  // dQ = dS K through an fp32 accumulator (the flash engines add each key block's share into it with atomics), or, in
  // deterministic mode, written whole (cuDNN then keeps dS in a workspace and sums over the keys in a fixed order)
  Desc k = g->virt_strided(bf, l.kv_dims, l.kv_str);
  g->reshape(kt, k);
  if (deterministic) {
    g->matmul(ds, k, dq);
  } else {
    g->matmul(ds, k, dq_accum);
    g->pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
  }
  if (!g->build(why)) return nullptr;
  return g;
}

}  // namespace

struct CudnnSdpa::Impl {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, bool, int, bool, int64_t, bool, int64_t, int64_t, uint32_t, bool, int64_t,
                         bool, int64_t>;
  std::atomic<bool> deterministic{false};
  struct Entry {
    std::unique_ptr<Graph> graph;
    void* workspace = nullptr;
    std::string error;
  };
  std::map<Key, Entry> cache;

  // (`deterministic`: the backward's kind; the forward has one)
  Entry& get(const SdpaShape& s, bool backward, bool deterministic_backward = false) {
    uint32_t scale_bits, dropout_bits;
    std::memcpy(&scale_bits, &s.scale, sizeof(scale_bits));
    std::memcpy(&dropout_bits, &s.dropout, sizeof(dropout_bits));
    const Key key{s.B,      s.S,    s.Hq,         s.Hk,         s.D,       scale_bits, backward, static_cast<int>(s.type), s.bias, s.keys(),
                  s.causal, s.q_stride(), s.kv_stride(), dropout_bits, backward && deterministic_backward, s.window, !backward && s.sink,
                  s.value_dim()};
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    Entry e;
    std::string why;
    if (s.D % 8 != 0 || s.D > 256 || s.value_dim() % 8 != 0 || s.value_dim() > 256 || s.Hq % s.Hk != 0) {
      why = "head dimensions must be multiples of 8 and at most 256, query heads a multiple of KV heads";
    } else if (s.dropout < 0 || s.dropout >= 1) {
      why = "the dropout probability must be in [0, 1)";
    } else if (!backward) {
      e.graph = forward_graph(handle, s, true, &why);
      if (!e.graph) {
        std::string why32;
        e.graph = forward_graph(handle, s, false, &why32);
        if (!e.graph) why += "; with fp32 probabilities: " + why32;
      }
    } else {
      e.graph = backward_graph(handle, s, std::get<14>(key), &why);
    }
    if (e.graph) {
      if (e.graph->workspace_bytes() > 0) e.workspace = DeviceAllocator::instance().allocate(static_cast<size_t>(e.graph->workspace_bytes()));
    } else {
      e.error = std::string("cuDNN has no fused attention ") + (backward ? "backward" : "forward") + " for batch " +
                std::to_string(s.B) + ", sequence " + std::to_string(s.S) + ", heads " + std::to_string(s.Hq) + "/" +
                std::to_string(s.Hk) + ", head dim " + std::to_string(s.D) +
                (s.value_dim() != s.D ? " (values " + std::to_string(s.value_dim()) + ")" : std::string()) +
                (s.keys() != s.S ? ", " + std::to_string(s.keys()) + " keys" : std::string()) + (s.causal ? "" : ", no causal mask") +
                (s.bias ? " with a document-mask bias" : "") + (s.dropout > 0 ? " with dropout " + std::to_string(s.dropout) : std::string()) +
                (std::get<14>(key) ? " in deterministic mode (--deterministic-mode)" : "") +
                (s.window >= 0 ? " with a sliding window of " + std::to_string(s.window) + " (--window-size)" : std::string()) +
                (s.sink && !backward ? " with attention sinks (--softmax-type)" : "") +
                ": " + why;
    }
    return cache.emplace(key, std::move(e)).first->second;
  }
};

CudnnSdpa& CudnnSdpa::instance() {
  static CudnnSdpa* s = new CudnnSdpa();
  return *s;
}

CudnnSdpa::CudnnSdpa() : impl_(std::make_unique<Impl>()) { MT_CUDNN_CHECK(cudnnCreate(&impl_->handle)); }
CudnnSdpa::~CudnnSdpa() = default;

void CudnnSdpa::set_deterministic(bool on) { impl_->deterministic = on; }
bool CudnnSdpa::deterministic() const { return impl_->deterministic; }

std::string CudnnSdpa::check(const SdpaShape& s) {
  auto& f = impl_->get(s, false);
  if (!f.graph) return f.error;
  auto& b = impl_->get(s, true, impl_->deterministic);
  return b.graph ? std::string() : b.error;
}

namespace {

// The variant pack's scalars and optional tensors beside the fixed ones: the mask's value only with the causal mask,
// the bias, and dropout's seed (stream-ordered device scalars: the seed, and 16 bytes on the offset 0; released after
// the call) and scales:
// the pack names exactly the graph's tensors.
struct Extras {
  float neg = std::numeric_limits<float>::lowest(), drop_scale = 1, drop_scale_inv = 1;
  float window_bound = 0;  // (the sliding window's left bound + 1)
  int64_t* seed = nullptr;
  void add(const SdpaShape& s, const void* bias, uint64_t dropout_seed, cudaStream_t stream, std::vector<int64_t>& uids, std::vector<void*>& ptrs) {
    if (s.causal) {
      uids.push_back(kNegInf);
      ptrs.push_back(&neg);
    }
    if (s.window >= 0) {
      window_bound = static_cast<float>(s.window + 1);
      uids.push_back(kWindow);
      ptrs.push_back(&window_bound);
    }
    if (bias) {
      uids.push_back(kBias);
      ptrs.push_back(const_cast<void*>(bias));
    }
    if (s.dropout > 0) {
      drop_scale = 1.0f / (1.0f - s.dropout);
      drop_scale_inv = 1.0f - s.dropout;
      seed = static_cast<int64_t*>(DeviceAllocator::instance().allocate(4 * sizeof(int64_t)));
      write_philox_seed(seed, dropout_seed, stream);
      uids.insert(uids.end(), {kSeed, kOffset, kDropScale});
      ptrs.insert(ptrs.end(), {seed, seed + 2, &drop_scale});
    }
  }
  ~Extras() {
    if (seed) DeviceAllocator::instance().release(seed);  // (stream order keeps it for the call)
  }
};

void check_arguments(const SdpaShape& s, const void* bias, uint64_t dropout_seed, const float* sink) {
  if (s.bias != (bias != nullptr)) throw std::logic_error("cuDNN attention: a bias pointer must come with SdpaShape::bias, and only with it");
  if (s.sink != (sink != nullptr)) throw std::logic_error("cuDNN attention: sink logits must come with SdpaShape::sink, and only with it");
  if ((s.dropout > 0) != (dropout_seed != 0)) throw std::logic_error("cuDNN attention: a dropout seed must come with SdpaShape::dropout, and only with it");
}

}  // namespace

void CudnnSdpa::forward(const SdpaShape& s, const void* q, const void* k, const void* v, void* o, float* stats, cudaStream_t stream,
                        const void* bias, uint64_t dropout_seed, const float* sink) {
  auto& e = impl_->get(s, false);
  if (!e.graph) throw std::runtime_error(e.error);
  check_arguments(s, bias, dropout_seed, sink);
  float scale = s.scale;
  MT_CUDNN_CHECK(cudnnSetStream(impl_->handle, stream));
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, stats, &scale};
  if (sink) {
    uids.push_back(kSink);
    ptrs.push_back(const_cast<float*>(sink));
  }
  Extras extras;
  extras.add(s, bias, dropout_seed, stream, uids, ptrs);
  e.graph->execute(impl_->handle, uids, ptrs, e.workspace);
}

void CudnnSdpa::backward(const SdpaShape& s, const void* q, const void* k, const void* v, const void* o, const void* d_o,
                         const float* stats, void* dq, void* dk, void* dv, cudaStream_t stream, const void* bias, uint64_t dropout_seed,
                         const float* sink, float* sink_grad) {
  const bool deterministic = impl_->deterministic;
  auto& e = impl_->get(s, true, deterministic);
  if (!e.graph) throw std::runtime_error(e.error);
  check_arguments(s, bias, dropout_seed, sink);
  float scale = s.scale, one = 1.0f;
  auto& alloc = DeviceAllocator::instance();
  const size_t sum_bytes = static_cast<size_t>(s.B * s.Hq * s.S) * sizeof(float);
  const size_t acc_bytes = sum_bytes * static_cast<size_t>(s.D);
  void* softmax_sum = alloc.allocate(sum_bytes);
  void* dq_accum = deterministic ? nullptr : alloc.allocate(acc_bytes);
  if (dq_accum) MT_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, acc_bytes, stream));
  MT_CUDNN_CHECK(cudnnSetStream(impl_->handle, stream));
  try {
    std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kSoftmaxSum};
    std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(o), const_cast<void*>(d_o),
                            const_cast<float*>(stats), dq, dk, dv, &scale, softmax_sum};
    if (dq_accum) {
      uids.push_back(kDQAccum);
      ptrs.push_back(dq_accum);
    }
    Extras extras;
    extras.add(s, bias, dropout_seed, stream, uids, ptrs);
    if (s.dropout > 0) {  // (softmax_sum's factor: 1 - p under dropout, 1 without)
      uids.push_back(kDropScaleInv);
      ptrs.push_back(&extras.drop_scale_inv);
    } else {
      uids.push_back(kOne);
      ptrs.push_back(&one);
    }
    e.graph->execute(impl_->handle, uids, ptrs, e.workspace);
    // The sink logits' gradient: -sum over rows of p_sink rowsum(dO * O), softmax_sum over its factor.
    if (sink && sink_grad) {
      attention_sink_grad(sink_grad, sink, stats, static_cast<const float*>(softmax_sum), s.dropout > 0 ? 1.0f / extras.drop_scale_inv : 1.0f, s.B, s.Hq,
                          s.S, s.q_stride(), stream);
    }
  } catch (...) {
    alloc.release(softmax_sum);
    if (dq_accum) alloc.release(dq_accum);
    throw;
  }
  // The blocks go back to the cache; stream order keeps them alive for the kernel that uses them.
  alloc.release(softmax_sum);
  if (dq_accum) alloc.release(dq_accum);
}

}  // namespace mt::cuda
