/*
 * cudnn_rnn_kernels.cc — CPU kernels for TensorFlow's CudnnRNN op family, computed by cgru.
 *
 * TensorFlow defines the eleven CudnnRNN ops in every build but registers kernels for GPUs only.
 * This library registers DEVICE_CPU kernels for all of them (float32, float64, and float16 /
 * bfloat16 computed in float32), built against the installed TensorFlow's headers and loaded with
 * tf.load_op_library (cgru.tf.load_kernels builds, caches and loads it).  The kernels call cgru's
 * public C ABI (include/cgru.h), which starts or joins the Python runtime, takes the GIL for its
 * bookkeeping and releases it inside the compute kernels, and returns a status code with a
 * thread-local message; every non-success status becomes a TensorFlow error status.
 *
 * Semantics are cgru.tf's (cgru/tf.py, docs/tf_kernels.md): cgru's opaque params layout (the
 * C ABI's weight space), TF's shapes, auto_select resolved against num_units, a seeded and
 * reproducible dropout.  TF's layouts map onto the C ABI's as follows:
 *   - input / output: [T, N, ·] (time_major) or [N, T, ·]: the C ABI's two layouts, zero-copy.
 *   - states: TF's [L·D, N, ·] (time_major) or [N, L·D, ·]; the C ABI's are always [L·D, N, ·],
 *     so batch-major states are transposed (a copy of the small state arrays only; none when
 *     L·D = 1 or N = 1, where both readings are the same memory).
 *   - reserve_space (dtype T, as TF's op declares): a header of this library (the call's shapes
 *     and attributes), exact copies of input_h, input_c and sequence_lengths, a seal (a keyed
 *     MAC), then the C ABI's training reserve space.  The backprop ops compare the header, the
 *     copies and the C ABI's copy of x with their own arguments byte for byte and refuse a
 *     reserve from another call, an edited one, or an inference forward's.  The C ABI's
 *     backward writes into its reserve space, while TF's inputs are immutable (two gradient
 *     computations may share one reserve), so the backprop works on a private copy — or on the
 *     input buffer itself when TF can forward it (no other reference to it exists).
 *   - the dummy outputs TF's kernels create (output_c and input_c_backprop without a cell state,
 *     reserve_space in inference, host_reserved) keep TF's shapes and hold zeros.
 */
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/types.h>
#include <sys/random.h>  // getentropy (Linux, macOS)

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

#include "cgru.h"

namespace cgru_tf {

using tensorflow::DataType;
using tensorflow::DataTypeToEnum;
using tensorflow::OpInputList;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::OpOutputList;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();  // cgru's 32-bit BLAS ints
constexpr int kMaxThreads = 256;  // desc->num_threads' range (1…256, 0: all usable cores)

// ---- element types ---------------------------------------------------------------------------
// The type cgru computes a T in: float16 and bfloat16 are computed in float32 (inputs widened
// exactly, outputs rounded to nearest); float32 and float64 as they are.
template <typename T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<Eigen::half> {
  using type = float;
};
template <>
struct ComputeType<Eigen::bfloat16> {
  using type = float;
};
template <typename T>
using ComputeT = typename ComputeType<T>::type;

template <typename C>
constexpr int32_t CgruDataType() {
  return std::is_same<C, double>::value ? CGRU_DATA_DOUBLE : CGRU_DATA_FLOAT;
}

template <typename To, typename From>
inline To Convert(From v) {
  return static_cast<To>(static_cast<float>(v));
}
template <>
inline float Convert<float, float>(float v) {
  return v;
}
template <>
inline double Convert<double, double>(double v) {
  return v;
}

// dst = src converted; with swap01, src [a, b, c] is written transposed as [b, a, c].
template <typename From, typename To>
void CopyConverted(const From* src, To* dst, int64_t a, int64_t b, int64_t c, bool swap01) {
  if (!swap01) {
    for (int64_t i = 0, n = a * b * c; i < n; ++i) dst[i] = Convert<To>(src[i]);
    return;
  }
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < c; ++k) dst[(j * a + i) * c + k] = Convert<To>(src[(i * b + j) * c + k]);
}

// ---- messages and statuses -------------------------------------------------------------------
std::string ShapeText(const TensorShape& s) { return s.DebugString(); }

std::string ShapeText(std::initializer_list<int64_t> dims) {
  std::string out = "[";
  for (int64_t d : dims) absl::StrAppend(&out, out.size() > 1 ? "," : "", d);
  return out + "]";
}

// The C ABI's argument names as this op calls them (the first word of its messages).
std::string TfName(const std::string& cgru_name) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"x", "input"}, {"hx", "input_h"}, {"cx", "input_c"}, {"y", "output"},
      {"hy", "output_h"}, {"cy", "output_c"}, {"dy", "output_backprop"},
      {"dhy", "output_h_backprop"}, {"dcy", "output_c_backprop"}, {"dx", "input_backprop"},
      {"dhx", "input_h_backprop"}, {"dcx", "input_c_backprop"}, {"weight_space", "params"},
      {"weight_space_size", "params"}, {"dweight_space", "params_backprop"},
      {"seq_lengths", "sequence_lengths"}, {"desc->input_size", "input_size"},
      {"desc->hidden_size", "num_units"}, {"desc->num_layers", "num_layers"},
      {"desc->proj_size", "num_proj"}, {"desc->dropout", "dropout"},
      {"reserve", "reserve_space"}};
  for (const auto& [ours, theirs] : kNames)
    if (cgru_name == ours) return theirs;
  return cgru_name;
}

// The TF status of a C ABI status, with the C ABI's thread-local message (read at once, on the
// calling thread) in TF's argument names.
absl::Status FromCgru(cgru_status_t status, const char* call) {
  if (status == CGRU_STATUS_SUCCESS) return absl::OkStatus();
  std::string message = cgru_get_last_error_message();
  size_t colon = message.find(": ");
  if (colon != std::string::npos && message.find(' ') >= colon)
    message = TfName(message.substr(0, colon)) + message.substr(colon);
  std::string text = absl::StrCat(message, " (cgru: ", call, " returned ",
                                  cgru_get_error_string(status), ")");
  switch (status) {
    case CGRU_STATUS_BAD_PARAM:
    case CGRU_STATUS_BUFFER_TOO_SMALL:
    case CGRU_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(text);
    case CGRU_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(text);
    case CGRU_STATUS_RUNTIME_UNAVAILABLE:
      return absl::FailedPreconditionError(text);
    default:
      return absl::InternalError(text);
  }
}

// ---- attributes ------------------------------------------------------------------------------
enum class InputMode { kLinear, kSkip, kAutoSelect };

// The attributes every op of the family has (num_proj: 0 for the ops without it).
struct RnnAttrs {
  std::string rnn_mode;
  int32_t cell_mode = CGRU_LSTM;
  int gates = 4;
  InputMode input_mode = InputMode::kLinear;
  bool bidirectional = false;
  float dropout = 0.f;
  int64_t seed = 0;
  int64_t seed2 = 0;
  int64_t num_proj = 0;

  bool has_cell_state() const { return cell_mode == CGRU_LSTM; }
  int directions() const { return bidirectional ? 2 : 1; }
};

absl::Status ParseRnnMode(const std::string& s, RnnAttrs* a) {
  static const struct {
    const char* name;
    int32_t cell_mode;
    int gates;
  } kModes[] = {{"lstm", CGRU_LSTM, 4}, {"gru", CGRU_GRU, 3}, {"rnn_tanh", CGRU_RNN_TANH, 1},
                {"rnn_relu", CGRU_RNN_RELU, 1}};
  for (const auto& m : kModes)
    if (s == m.name) {
      a->rnn_mode = s;
      a->cell_mode = m.cell_mode;
      a->gates = m.gates;
      return absl::OkStatus();
    }
  return absl::InvalidArgumentError(
      absl::StrCat("rnn_mode: expected one of 'gru', 'lstm', 'rnn_relu', 'rnn_tanh', got '", s,
                   "' (Invalid RNN mode)"));
}

absl::Status ParseInputMode(const std::string& s, InputMode* mode) {
  if (s == "linear_input") *mode = InputMode::kLinear;
  else if (s == "skip_input") *mode = InputMode::kSkip;
  else if (s == "auto_select") *mode = InputMode::kAutoSelect;
  else
    return absl::InvalidArgumentError(absl::StrCat(
        "input_mode: expected one of 'auto_select', 'linear_input', 'skip_input', got '", s,
        "' (Invalid RNN input mode)"));
  return absl::OkStatus();
}

absl::Status ParseDirection(const std::string& s, bool* bidirectional) {
  if (s != "unidirectional" && s != "bidirectional")
    return absl::InvalidArgumentError(absl::StrCat(
        "direction: expected one of 'bidirectional', 'unidirectional', got '", s,
        "' (Invalid RNN direction mode)"));
  *bidirectional = s == "bidirectional";
  return absl::OkStatus();
}

absl::Status ReadRnnAttrs(OpKernelConstruction* ctx, RnnAttrs* a) {
  std::string s;
  TF_RETURN_IF_ERROR(ctx->GetAttr("rnn_mode", &s));
  TF_RETURN_IF_ERROR(ParseRnnMode(s, a));
  TF_RETURN_IF_ERROR(ctx->GetAttr("input_mode", &s));
  TF_RETURN_IF_ERROR(ParseInputMode(s, &a->input_mode));
  TF_RETURN_IF_ERROR(ctx->GetAttr("direction", &s));
  TF_RETURN_IF_ERROR(ParseDirection(s, &a->bidirectional));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dropout", &a->dropout));
  TF_RETURN_IF_ERROR(ctx->GetAttr("seed", &a->seed));
  TF_RETURN_IF_ERROR(ctx->GetAttr("seed2", &a->seed2));
  if (ctx->HasAttr("num_proj")) TF_RETURN_IF_ERROR(ctx->GetAttr("num_proj", &a->num_proj));
  if (!(a->dropout >= 0.f && a->dropout < 1.f))
    return absl::InvalidArgumentError(
        absl::StrCat("dropout: expected a float in [0, 1), got ", a->dropout));
  if (a->num_proj < 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "num_proj: expected 0 (no projection) or a positive int, got ", a->num_proj));
  if (a->num_proj && !a->has_cell_state())
    return absl::InvalidArgumentError(absl::StrCat(
        "num_proj: expected 0 for rnn_mode='", a->rnn_mode, "' (cuDNN's recurrent projection "
        "exists for rnn_mode='lstm' only), got ", a->num_proj));
  return absl::OkStatus();
}

// ---- the network's sizes and the C ABI descriptor --------------------------------------------
struct Topology {
  int64_t L = 0, H = 0, I = 0, P = 0, D = 1;
  bool skip = false;

  int64_t LD() const { return L * D; }
  int64_t S() const { return P ? P : H; }  // the state width
};

const char* InputModeName(bool skip) { return skip ? "skip_input" : "linear_input"; }

std::string Describe(const RnnAttrs& a, const Topology& t) {
  return absl::StrCat("rnn_mode='", a.rnn_mode, "', num_layers=", t.L, ", num_units=", t.H,
                      ", input_size=", t.I, t.P ? absl::StrCat(", num_proj=", t.P) : "",
                      ", input_mode='", InputModeName(t.skip), "', direction='",
                      a.bidirectional ? "bidirectional" : "unidirectional", "'");
}

// The stack of num_layers L, num_units H and input_size I under the attributes; auto_select
// resolves as TF's ToRNNInputMode (skip when input_size == num_units).
absl::Status MakeTopology(const RnnAttrs& a, int64_t L, int64_t H, int64_t I, Topology* t) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"num_layers", L}, {"num_units", H}, {"input_size", I}};
  for (const auto& [name, v] : sizes)
    if (v < 1)
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected a positive int, got ", v));
  if (a.num_proj > H)
    return absl::InvalidArgumentError(absl::StrCat(
        "num_proj: expected at most num_units=", H, " (cuDNN's rule: the projection narrows h), "
        "got ", a.num_proj));
  bool skip = a.input_mode == InputMode::kSkip || (a.input_mode == InputMode::kAutoSelect && I == H);
  if (skip && I != H)
    return absl::InvalidArgumentError(absl::StrCat(
        "input_mode='skip_input' needs input_size == num_units (cuDNN's CUDNN_SKIP_INPUT adds the "
        "input to the gates unprojected), got input_size=", I, ", num_units=", H));
  if (a.gates * H > kIntMax || L * a.directions() > kIntMax || I > kIntMax)
    return absl::InvalidArgumentError(absl::StrCat(
        "num_units, num_layers, input_size: ", a.gates, "·num_units, L·D and input_size must fit "
        "cgru's 32-bit BLAS ints (", kIntMax, "), got num_units=", H, ", num_layers=", L,
        ", input_size=", I));
  *t = Topology{L, H, I, a.num_proj, a.directions(), skip};
  return absl::OkStatus();
}

// The C ABI descriptor of the stack, computing in data_type (CGRU_DATA_FLOAT / _DOUBLE).
absl::Status MakeDesc(const RnnAttrs& a, const Topology& t, int32_t data_type, int num_threads,
                      cgru_rnn_desc_t* desc) {
  TF_RETURN_IF_ERROR(FromCgru(cgru_rnn_desc_init(desc), "cgru_rnn_desc_init"));
  desc->data_type = data_type;
  desc->input_size = static_cast<int32_t>(t.I);
  desc->hidden_size = static_cast<int32_t>(t.H);
  desc->num_layers = static_cast<int32_t>(t.L);
  desc->direction = a.bidirectional ? CGRU_BIDIRECTIONAL : CGRU_UNIDIRECTIONAL;
  desc->input_mode = t.skip ? CGRU_SKIP_INPUT : CGRU_LINEAR_INPUT;
  desc->reset_after = 1;
  desc->num_threads = std::clamp(num_threads, 0, kMaxThreads);
  desc->dropout = a.dropout;
  // without dropout the seeds select nothing: 0, so that a forward and its backprop agree
  // whatever seeds they carry (as in cgru.tf)
  desc->seed = a.dropout > 0.f ? a.seed : 0;
  desc->seed2 = a.dropout > 0.f ? a.seed2 : 0;
  desc->cell_mode = a.cell_mode;
  desc->proj_size = static_cast<int32_t>(t.P);
  return absl::OkStatus();
}

// Threads for cgru's pool: TensorFlow's intra-op parallelism of this device (0: cgru's default).
int IntraOpThreads(OpKernelContext* ctx) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  return workers ? workers->num_threads : 0;
}

// Elements of the opaque params (the C ABI's weight space) of desc.
absl::Status ParamsElements(const cgru_rnn_desc_t& desc, int64_t item, int64_t* count) {
  size_t bytes = 0;
  TF_RETURN_IF_ERROR(FromCgru(cgru_get_weight_space_size(&desc, &bytes),
                              "cgru_get_weight_space_size"));
  *count = static_cast<int64_t>(bytes) / item;
  return absl::OkStatus();
}

// The C ABI's size queries for one kernel, remembered: with the kernel's attributes fixed they
// are functions of input_size, num_units, num_layers, T and N only, so a steady stream of calls
// asks the C ABI (one Python round trip each) for the compute alone.  Thread-safe.
class SizeQueries {
 public:
  absl::Status ParamsElements(const cgru_rnn_desc_t& desc, int64_t item, int64_t* count) {
    std::pair<uint64_t, uint64_t> v;
    TF_RETURN_IF_ERROR(Lookup(desc, -1, 0, 0, &v));
    *count = static_cast<int64_t>(v.first) / item;
    return absl::OkStatus();
  }

  absl::Status TempSizes(const cgru_rnn_desc_t& desc, cgru_fwd_mode_t mode, int64_t T, int64_t N,
                         size_t* work_bytes, size_t* reserve_bytes) {
    std::pair<uint64_t, uint64_t> v;
    TF_RETURN_IF_ERROR(Lookup(desc, mode, T, N, &v));
    *work_bytes = v.first;
    *reserve_bytes = v.second;
    return absl::OkStatus();
  }

 private:
  using Key = std::array<int64_t, 6>;  // input_size, hidden_size, num_layers, query, T, N
  static constexpr size_t kMaxEntries = 256;

  // query -1: the weight space's bytes (first); else the temp sizes of that fwd_mode
  absl::Status Lookup(const cgru_rnn_desc_t& desc, int64_t query, int64_t T, int64_t N,
                      std::pair<uint64_t, uint64_t>* value) {
    Key key{desc.input_size, desc.hidden_size, desc.num_layers, query, T, N};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = known_.find(key);
      if (it != known_.end()) {
        *value = it->second;
        return absl::OkStatus();
      }
    }
    size_t a = 0, b = 0;
    if (query < 0) {
      TF_RETURN_IF_ERROR(FromCgru(cgru_get_weight_space_size(&desc, &a),
                                  "cgru_get_weight_space_size"));
    } else {
      TF_RETURN_IF_ERROR(FromCgru(
          cgru_get_temp_space_sizes(&desc, static_cast<cgru_fwd_mode_t>(query),
                                    static_cast<int32_t>(T), static_cast<int32_t>(N), &a, &b),
          "cgru_get_temp_space_sizes"));
    }
    *value = {a, b};
    std::lock_guard<std::mutex> lock(mu_);
    if (known_.size() >= kMaxEntries) known_.clear();
    known_[key] = *value;
    return absl::OkStatus();
  }

  std::mutex mu_;
  std::map<Key, std::pair<uint64_t, uint64_t>> known_;
};

// ---- the size inputs of the params ops -------------------------------------------------------
absl::Status ScalarInput(OpKernelContext* ctx, const char* name, int64_t* value) {
  const Tensor* t = nullptr;
  TF_RETURN_IF_ERROR(ctx->input(name, &t));
  if (t->dims() != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": expected an int32 scalar, got shape ", ShapeText(t->shape())));
  *value = t->scalar<int32_t>()();
  return absl::OkStatus();
}

absl::Status SizeInputs(OpKernelContext* ctx, const RnnAttrs& a, Topology* t) {
  int64_t L = 0, H = 0, I = 0;
  TF_RETURN_IF_ERROR(ScalarInput(ctx, "num_layers", &L));
  TF_RETURN_IF_ERROR(ScalarInput(ctx, "num_units", &H));
  TF_RETURN_IF_ERROR(ScalarInput(ctx, "input_size", &I));
  return MakeTopology(a, L, H, I, t);
}

// ---- CudnnRNNParamsSize ----------------------------------------------------------------------
template <typename T, typename Index>
class ParamsSizeOp : public OpKernel {
 public:
  explicit ParamsSizeOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadRnnAttrs(ctx, &attrs_));
  }

  void Compute(OpKernelContext* ctx) override {
    using C = ComputeT<T>;
    Topology topo;
    OP_REQUIRES_OK(ctx, SizeInputs(ctx, attrs_, &topo));
    cgru_rnn_desc_t desc;
    OP_REQUIRES_OK(ctx, MakeDesc(attrs_, topo, CgruDataType<C>(), 0, &desc));
    int64_t count = 0;
    OP_REQUIRES_OK(ctx, ParamsElements(desc, sizeof(C), &count));
    OP_REQUIRES(ctx, count <= static_cast<int64_t>(std::numeric_limits<Index>::max()),
                absl::InvalidArgumentError(absl::StrCat(
                    "params_size: ", count, " elements do not fit the output dtype S=int32; "
                    "use S=int64")));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({1}), &out));
    out->flat<Index>()(0) = static_cast<Index>(count);
  }

 private:
  RnnAttrs attrs_;
};

// ---- the canonical lists ---------------------------------------------------------------------
// Where one canonical weight and bias live in the opaque params, in elements.
struct Region {
  int64_t matrix_offset = 0, rows = 0, cols = 0;  // cols = 0: not stored (skip input)
  int64_t bias_offset = -1;                        // -1: none (the projection)
};

// The regions of every (pseudo-layer, linLayerID), pseudo-layer-major, from the C ABI's weight
// accessor on a weight space of desc (base: any buffer of its size; only addresses are read).
absl::Status Regions(const cgru_rnn_desc_t& desc, const Topology& t, int per_layer,
                     const char* base, size_t bytes, int64_t item, std::vector<Region>* out) {
  out->clear();
  for (int64_t p = 0; p < t.LD(); ++p)
    for (int k = 0; k < per_layer; ++k) {
      void* m = nullptr;
      void* b = nullptr;
      int32_t dims[2] = {0, 0};
      int32_t b_dim = 0;
      TF_RETURN_IF_ERROR(FromCgru(
          cgru_get_weight_params(&desc, static_cast<int32_t>(p), bytes, base, k, &m, dims, &b, &b_dim),
          "cgru_get_weight_params"));
      Region r;
      r.rows = dims[0];
      r.cols = dims[1];
      if (m) r.matrix_offset = (static_cast<const char*>(m) - base) / item;
      if (b) r.bias_offset = (static_cast<const char*>(b) - base) / item;
      out->push_back(r);
    }
  return absl::OkStatus();
}

const char* WeightName(const RnnAttrs& a, int k) {
  static const char* kGru[] = {"W_r", "W_z", "W_n", "R_r", "R_z", "R_n"};
  static const char* kLstm[] = {"W_i", "W_f", "W_g", "W_o", "R_i", "R_f", "R_g", "R_o", "W_p"};
  static const char* kRnn[] = {"W", "R"};
  if (a.cell_mode == CGRU_GRU) return kGru[k];
  if (a.cell_mode == CGRU_LSTM) return kLstm[k];
  return kRnn[k];
}

// Counts of the lists per pseudo-layer: K weights (2G, plus the projection), 2G biases.
struct ListCounts {
  int64_t K, B;
};

ListCounts CountsOf(const RnnAttrs& a, const Topology& t) {
  return {2 * a.gates + (t.P ? 1 : 0), 2 * a.gates};
}

absl::Status CheckListCount(const char* attr, int64_t given, int64_t per, const RnnAttrs& a,
                            const Topology& t) {
  if (given == per * t.LD()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      attr, ": expected ", per * t.LD(), " (", per, " per layer and direction for rnn_mode='",
      a.rnn_mode, "'", t.P ? ", the projection last" : "", "; L=", t.L, ", D=", t.D, "), got ",
      given));
}

// The list-count attributes of the canonical ops: V1's num_params (both lists), V2's
// num_params_weights and num_params_biases.
struct ListAttrs {
  int64_t weights = 0, biases = 0;
  bool v2 = false;
};

absl::Status ReadListAttrs(OpKernelConstruction* ctx, ListAttrs* l) {
  l->v2 = ctx->HasAttr("num_params_weights");
  if (!l->v2) {
    TF_RETURN_IF_ERROR(ctx->GetAttr("num_params", &l->weights));
    l->biases = l->weights;
    return absl::OkStatus();
  }
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_params_weights", &l->weights));
  return ctx->GetAttr("num_params_biases", &l->biases);
}

absl::Status CheckListAttrs(const ListAttrs& l, const RnnAttrs& a, const Topology& t) {
  ListCounts c = CountsOf(a, t);
  if (!l.v2) return CheckListCount("num_params", l.weights, c.K, a, t);
  TF_RETURN_IF_ERROR(CheckListCount("num_params_weights", l.weights, c.K, a, t));
  return CheckListCount("num_params_biases", l.biases, c.B, a, t);
}

// What a canonical op needs: the topology, its descriptor, the list counts and the size of
// its params; then (Locate) where each canonical array lives in them.
struct CanonicalCall {
  Topology topo;
  cgru_rnn_desc_t desc;
  ListCounts counts{0, 0};
  int64_t params_elements = 0;
  std::vector<Region> regions;
};

template <typename T>
absl::Status PrepareCanonical(OpKernelContext* ctx, const RnnAttrs& a, const ListAttrs& l,
                              CanonicalCall* call) {
  using C = ComputeT<T>;
  TF_RETURN_IF_ERROR(SizeInputs(ctx, a, &call->topo));
  TF_RETURN_IF_ERROR(CheckListAttrs(l, a, call->topo));
  TF_RETURN_IF_ERROR(MakeDesc(a, call->topo, CgruDataType<C>(), 0, &call->desc));
  TF_RETURN_IF_ERROR(ParamsElements(call->desc, sizeof(C), &call->params_elements));
  call->counts = CountsOf(a, call->topo);
  return absl::OkStatus();
}

// The regions of the canonical arrays in params (a tensor of params_elements Ts).  The C ABI's
// accessor takes a weight space of the compute type and returns addresses in it: params itself
// for float32 / float64, a scratch buffer of that size (never read) for float16 / bfloat16.
template <typename T>
absl::Status Locate(OpKernelContext* ctx, const Tensor& params, CanonicalCall* call) {
  using C = ComputeT<T>;
  Tensor scratch;
  const char* base = reinterpret_cast<const char*>(params.flat<T>().data());
  if (!std::is_same<T, C>::value) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DataTypeToEnum<C>::v(),
                                          TensorShape({call->params_elements}), &scratch));
    base = reinterpret_cast<const char*>(scratch.flat<C>().data());
  }
  return Regions(call->desc, call->topo, static_cast<int>(call->counts.K), base,
                 call->params_elements * sizeof(C), sizeof(C), &call->regions);
}

std::string WhereText(const RnnAttrs& a, const Topology& t, int64_t p, int64_t k) {
  return absl::StrCat(WeightName(a, static_cast<int>(k)), " (layer ", p / t.D, ", direction ",
                      p % t.D, ", linLayerID ", k, ")");
}

// CudnnRNNParamsToCanonical (V1, num_params) and CudnnRNNParamsToCanonicalV2.
template <typename T>
class ParamsToCanonicalOp : public OpKernel {
 public:
  explicit ParamsToCanonicalOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadRnnAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, ReadListAttrs(ctx, &lists_));
  }

  void Compute(OpKernelContext* ctx) override {
    CanonicalCall call;
    OP_REQUIRES_OK(ctx, PrepareCanonical<T>(ctx, attrs_, lists_, &call));
    const Tensor& params = ctx->input(3);
    OP_REQUIRES(ctx, params.dims() == 1 && params.NumElements() == call.params_elements,
                absl::InvalidArgumentError(absl::StrCat(
                    "Invalid params size: expected a 1-D array of ", call.params_elements,
                    " elements (params_size for ", Describe(attrs_, call.topo), "), got shape ",
                    ShapeText(params.shape()))));
    OP_REQUIRES_OK(ctx, Locate<T>(ctx, params, &call));
    const T* src = params.flat<T>().data();
    OpOutputList weights, biases;
    OP_REQUIRES_OK(ctx, ctx->output_list("weights", &weights));
    OP_REQUIRES_OK(ctx, ctx->output_list("biases", &biases));
    const int64_t K = call.counts.K, B = call.counts.B, H = call.topo.H;
    for (int64_t i = 0; i < static_cast<int64_t>(call.regions.size()); ++i) {
      const Region& r = call.regions[i];
      Tensor* w = nullptr;
      OP_REQUIRES_OK(ctx, weights.allocate(static_cast<int>(i), TensorShape({r.rows, r.cols}), &w));
      std::copy_n(src + r.matrix_offset, r.rows * r.cols, w->flat<T>().data());
      int64_t k = i % K;
      if (k < B) {  // the biases, in the same linLayerID slots (none for the projection)
        Tensor* b = nullptr;
        int64_t j = (i / K) * B + k;
        OP_REQUIRES_OK(ctx, biases.allocate(static_cast<int>(j), TensorShape({H}), &b));
        std::copy_n(src + r.bias_offset, H, b->flat<T>().data());
      }
    }
  }

 private:
  RnnAttrs attrs_;
  ListAttrs lists_;
};

// CudnnRNNCanonicalToParams (V1) and CudnnRNNCanonicalToParamsV2.  As TF's kernel, each array is
// read in row-major order and only its element count is checked against its canonical shape.
template <typename T>
class CanonicalToParamsOp : public OpKernel {
 public:
  explicit CanonicalToParamsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadRnnAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, ReadListAttrs(ctx, &lists_));
  }

  void Compute(OpKernelContext* ctx) override {
    CanonicalCall call;
    OP_REQUIRES_OK(ctx, PrepareCanonical<T>(ctx, attrs_, lists_, &call));
    Tensor* params = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({call.params_elements}), &params));
    OP_REQUIRES_OK(ctx, Locate<T>(ctx, *params, &call));
    OpInputList weights, biases;
    OP_REQUIRES_OK(ctx, ctx->input_list("weights", &weights));
    OP_REQUIRES_OK(ctx, ctx->input_list("biases", &biases));
    OP_REQUIRES_OK(ctx, CheckLists(weights, biases, call));
    T* dst = params->flat<T>().data();
    std::fill_n(dst, call.params_elements, T(0));
    const int64_t K = call.counts.K, B = call.counts.B, H = call.topo.H;
    for (int64_t i = 0; i < static_cast<int64_t>(call.regions.size()); ++i) {
      const Region& r = call.regions[i];
      std::copy_n(weights[static_cast<int>(i)].flat<T>().data(), r.rows * r.cols,
                  dst + r.matrix_offset);
      int64_t k = i % K;
      if (k < B)
        std::copy_n(biases[static_cast<int>((i / K) * B + k)].flat<T>().data(), H,
                    dst + r.bias_offset);
    }
  }

 private:
  absl::Status CheckLists(const OpInputList& weights, const OpInputList& biases,
                          const CanonicalCall& call) const {
    const int64_t K = call.counts.K, B = call.counts.B, H = call.topo.H;
    for (int64_t i = 0; i < static_cast<int64_t>(call.regions.size()); ++i) {
      const Region& r = call.regions[i];
      const Tensor& w = weights[static_cast<int>(i)];
      if (w.NumElements() != r.rows * r.cols)
        return absl::InvalidArgumentError(absl::StrCat(
            "weights[", i, "] ", WhereText(attrs_, call.topo, i / K, i % K),
            ": Params size mismatch: expected shape ", ShapeText({r.rows, r.cols}), " (",
            r.rows * r.cols, " elements), got ", ShapeText(w.shape())));
    }
    for (int64_t j = 0; j < B * call.topo.LD(); ++j) {
      const Tensor& b = biases[static_cast<int>(j)];
      if (b.NumElements() != H)
        return absl::InvalidArgumentError(absl::StrCat(
            "biases[", j, "] b_", WeightName(attrs_, static_cast<int>(j % B)), " (layer ",
            j / B / call.topo.D, ", direction ", (j / B) % call.topo.D, ", linLayerID ", j % B,
            "): Params size mismatch: expected shape [", H, "], got ", ShapeText(b.shape())));
    }
    return absl::OkStatus();
  }

  RnnAttrs attrs_;
  ListAttrs lists_;
};

// ---- the forward inputs ----------------------------------------------------------------------
// Which op of the family: the V1, V2 and V3 forward and backprop ops share one implementation.
struct OpVersion {
  int version;              // 1, 2, 3
  bool has_lengths() const { return version == 3; }
  bool has_host_reserved() const { return version >= 2; }
};

// The forward inputs of a call, checked as TF's ExtractForwardInput (cgru.tf's messages), with
// the shapes of every array in TF's layout.
struct Call {
  Topology topo;
  bool time_major = true;
  int64_t T = 0, N = 0;
  const Tensor* input = nullptr;
  const Tensor* input_h = nullptr;
  const Tensor* input_c = nullptr;  // LSTM only
  const Tensor* params = nullptr;
  const Tensor* lengths = nullptr;  // V3 only
  TensorShape output_shape, h_shape, c_shape;
  cgru_rnn_desc_t desc;

  // batch-major states whose two first axes differ in memory from the C ABI's [L·D, N, ·]
  bool swap_states() const { return !time_major && topo.LD() > 1 && N > 1; }
  cgru_layout_t layout() const {
    return time_major ? CGRU_LAYOUT_TIME_MAJOR : CGRU_LAYOUT_BATCH_MAJOR;
  }
  const int32_t* seq_lengths() const {
    return lengths ? lengths->flat<int32_t>().data() : nullptr;
  }
};

std::string StateLayout(bool time_major, const char* width) {
  return time_major ? absl::StrCat("[L·D, N, ", width, "]") : absl::StrCat("[N, L·D, ", width, "]");
}

TensorShape StateShape(bool time_major, int64_t LD, int64_t N, int64_t width) {
  return time_major ? TensorShape({LD, N, width}) : TensorShape({N, LD, width});
}

absl::Status CheckInput(const Tensor& input, bool time_major, Call* call) {
  const char* layout = time_major ? "[T, N, I]" : "[N, T, I]";
  if (input.dims() != 3)
    return absl::InvalidArgumentError(absl::StrCat(
        "RNN input must be a 3-D array ", layout, ", got shape ", ShapeText(input.shape())));
  call->T = input.dim_size(time_major ? 0 : 1);
  call->N = input.dim_size(time_major ? 1 : 0);
  int64_t I = input.dim_size(2);
  if (call->T == 0 || call->N == 0 || I == 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "input: expected max_seq_length ≥ 1, batch_size ≥ 1 and input_size ≥ 1 in ", layout,
        ", got shape ", ShapeText(input.shape())));
  if (call->T * call->N > kIntMax || I > kIntMax)
    return absl::InvalidArgumentError(absl::StrCat(
        "input: T·N = ", call->T * call->N, " and input_size = ", I, " must fit cgru's 32-bit "
        "BLAS ints (", kIntMax, ")"));
  return absl::OkStatus();
}

// input_h's L·D and state width S (num_proj with a projection).
absl::Status CheckInputH(const Tensor& h, const RnnAttrs& a, Call* call, int64_t* LD,
                         int64_t* S) {
  const char* width = a.num_proj ? "num_proj" : "H";
  if (h.dims() != 3)
    return absl::InvalidArgumentError(absl::StrCat(
        "RNN input_h must be a 3-D array ", StateLayout(call->time_major, width), ", got shape ",
        ShapeText(h.shape())));
  const int D = a.directions();
  *LD = h.dim_size(call->time_major ? 0 : 1);
  *S = a.num_proj ? a.num_proj : h.dim_size(2);
  TensorShape want = StateShape(call->time_major, *LD, call->N, *S);
  if (*LD == 0 || *LD % D != 0 || *S == 0 || h.shape() != want)
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid input_h shape: ", ShapeText(h.shape()), " ", ShapeText(want),
        " (input_h: expected ", StateLayout(call->time_major, width), " with N=", call->N,
        " from input, L·D a positive multiple of D=", D, " (",
        a.bidirectional ? "bidirectional" : "unidirectional", ")",
        a.num_proj ? absl::StrCat(" and S = num_proj=", a.num_proj) : " and H ≥ 1", ")"));
  return absl::OkStatus();
}

// The LSTM's input_c and its width H.
absl::Status CheckInputC(const Tensor& c, const Tensor& h, const RnnAttrs& a, bool time_major,
                         int64_t* H) {
  std::string layout = StateLayout(time_major, "H");
  if (c.dims() != 3)
    return absl::InvalidArgumentError(absl::StrCat(
        "RNN input_c must be a 3-D array ", layout, " (rnn_mode='lstm' needs the initial cell "
        "state), got shape ", ShapeText(c.shape())));
  if (!a.num_proj) {
    if (c.shape() != h.shape())
      return absl::InvalidArgumentError(absl::StrCat(
          "Invalid input_c shape: ", ShapeText(c.shape()), " ", ShapeText(h.shape()),
          " (input_c: expected the shape of input_h, ", layout, " — TF: input_h and input_c "
          "must have the same shape w/o projection)"));
  } else if (c.dim_size(0) != h.dim_size(0) || c.dim_size(1) != h.dim_size(1) ||
             c.dim_size(2) < a.num_proj) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid input_c shape: ", ShapeText(c.shape()), " (input_c: expected ", layout,
        " with the first two axes of input_h ", ShapeText(h.shape()), " and num_units H ≥ "
        "num_proj=", a.num_proj, " — TF: Invalid input_h and input_c w/ projection size)"));
  }
  *H = c.dim_size(2);
  return absl::OkStatus();
}

absl::Status CheckLengths(const Tensor& lengths, const Call& call) {
  if (lengths.dims() != 1 || lengths.dim_size(0) != call.N)
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence_lengths: expected shape [", call.N, "] (one length per batch entry), got ",
        ShapeText(lengths.shape())));
  const int32_t* v = lengths.flat<int32_t>().data();
  for (int64_t b = 0; b < call.N; ++b)
    if (v[b] < 0 || v[b] > call.T)
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence_lengths: expected values in [0, max_seq_length=", call.T,
          "], got sequence_lengths[", b, "] = ", v[b]));
  return absl::OkStatus();
}

// Reads and checks the forward inputs (every forward and backprop op starts here).
template <typename T>
absl::Status PrepareCall(OpKernelContext* ctx, const RnnAttrs& a, const OpVersion& v,
                         bool time_major, SizeQueries* sizes, Call* call) {
  using C = ComputeT<T>;
  call->time_major = time_major;
  TF_RETURN_IF_ERROR(ctx->input("input", &call->input));
  TF_RETURN_IF_ERROR(ctx->input("input_h", &call->input_h));
  TF_RETURN_IF_ERROR(ctx->input("params", &call->params));
  TF_RETURN_IF_ERROR(CheckInput(*call->input, time_major, call));
  int64_t LD = 0, S = 0, H = 0;
  TF_RETURN_IF_ERROR(CheckInputH(*call->input_h, a, call, &LD, &S));
  H = S;
  if (a.has_cell_state()) {  // the other modes ignore input_c (TF's GPU kernel does not read it)
    TF_RETURN_IF_ERROR(ctx->input("input_c", &call->input_c));
    TF_RETURN_IF_ERROR(CheckInputC(*call->input_c, *call->input_h, a, time_major, &H));
  }
  TF_RETURN_IF_ERROR(MakeTopology(a, LD / a.directions(), H, call->input->dim_size(2), &call->topo));
  const Topology& t = call->topo;
  TF_RETURN_IF_ERROR(MakeDesc(a, t, CgruDataType<C>(), IntraOpThreads(ctx), &call->desc));
  int64_t n = 0;
  TF_RETURN_IF_ERROR(sizes->ParamsElements(call->desc, sizeof(C), &n));
  const Tensor& params = *call->params;
  if (params.dims() != 1 || params.NumElements() != n)
    return absl::InvalidArgumentError(absl::StrCat(
        "Invalid params size: expected a 1-D array of ", n, " elements (params_size for ",
        Describe(a, t), "), got shape ", ShapeText(params.shape())));
  if (v.has_lengths()) {
    TF_RETURN_IF_ERROR(ctx->input("sequence_lengths", &call->lengths));
    TF_RETURN_IF_ERROR(CheckLengths(*call->lengths, *call));
  }
  call->output_shape = time_major ? TensorShape({call->T, call->N, t.D * t.S()})
                                  : TensorShape({call->N, call->T, t.D * t.S()});
  call->h_shape = StateShape(time_major, t.LD(), call->N, t.S());
  call->c_shape = StateShape(time_major, t.LD(), call->N, t.H);
  return absl::OkStatus();
}

// ---- staging between TF's tensors and the C ABI's buffers ------------------------------------
// An input as the C ABI reads it: the tensor's own memory, or (for float16 / bfloat16, or states
// to transpose) a converted copy.
template <typename T>
absl::Status StageInput(OpKernelContext* ctx, const Tensor& t, bool swap01, Tensor* staged,
                        const ComputeT<T>** data) {
  using C = ComputeT<T>;
  const T* src = t.flat<T>().data();
  if (std::is_same<T, C>::value && !swap01) {
    *data = reinterpret_cast<const C*>(src);
    return absl::OkStatus();
  }
  TensorShape shape = t.shape();
  if (swap01) shape = TensorShape({t.dim_size(1), t.dim_size(0), t.dim_size(2)});
  TF_RETURN_IF_ERROR(ctx->allocate_temp(DataTypeToEnum<C>::v(), shape, staged));
  C* dst = staged->flat<C>().data();
  if (swap01)
    CopyConverted(src, dst, t.dim_size(0), t.dim_size(1), t.dim_size(2), true);
  else
    CopyConverted(src, dst, 1, 1, t.NumElements(), false);
  *data = dst;
  return absl::OkStatus();
}

// An output the C ABI writes: the output tensor's memory, or a staging buffer converted (and
// transposed) into it by Finish.
template <typename T>
class OutputStage {
 public:
  using C = ComputeT<T>;

  absl::Status Init(OpKernelContext* ctx, Tensor* out, bool swap01) {
    out_ = out;
    swap01_ = swap01;
    staged_ = !std::is_same<T, C>::value || swap01;
    if (!staged_) return absl::OkStatus();
    TensorShape shape = out->shape();
    if (swap01) shape = TensorShape({out->dim_size(1), out->dim_size(0), out->dim_size(2)});
    return ctx->allocate_temp(DataTypeToEnum<C>::v(), shape, &temp_);
  }

  C* data() { return staged_ ? temp_.flat<C>().data() : reinterpret_cast<C*>(out_->flat<T>().data()); }

  void Finish() {
    if (!staged_) return;
    if (swap01_)
      CopyConverted(temp_.flat<C>().data(), out_->flat<T>().data(), temp_.dim_size(0),
                    temp_.dim_size(1), temp_.dim_size(2), true);
    else
      CopyConverted(temp_.flat<C>().data(), out_->flat<T>().data(), 1, 1, out_->NumElements(),
                    false);
  }

 private:
  Tensor* out_ = nullptr;
  Tensor temp_;
  bool swap01_ = false;
  bool staged_ = false;
};

// A dummy output TF's kernels create (shape [] or [2]), holding zeros.
template <typename V>
absl::Status ZeroOutput(OpKernelContext* ctx, int index, const TensorShape& shape) {
  Tensor* t = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, shape, &t));
  std::fill_n(t->flat<V>().data(), t->NumElements(), V(0));
  return absl::OkStatus();
}

// ---- the reserve space -----------------------------------------------------------------------
// A training forward's reserve_space (dtype T) holds, in bytes, every region 64-byte aligned:
//
//   [0, 256)             the header: ReserveHeader (the call's shapes, attributes, dtype and
//                        the regions' sizes), zero-padded, its last 8 bytes the seal (below)
//   [256, tf_bytes)      exact copies of input_h and input_c (LSTM; none otherwise) as given
//                        (TF's layout, dtype T), then sequence_lengths (int32 [N]; zeros
//                        without them): tf_bytes = 256 + ⌈input_h⌉ + ⌈input_c⌉ + ⌈4·N⌉
//   [tf_bytes, +abi)     the C ABI's training reserve space (cgru/capi/__init__.py): its
//                        header (int64[32]: slots 4…7 the offsets of its regions engine, x, dw
//                        and its total), the engine's reserve (cgru/core/reserve.py; it starts
//                        with its own header int64[16]), a copy of the forward's x as the C ABI
//                        read it (compute type, the call's layout), room for dw
//
// How a backprop's arguments are bound to the forward's (each exactly, none by a hash anyone
// could steer):
//   input             byte for byte (in the compute type) against the C ABI's copy of x, which
//                     the engine's backward checks against the keyed MAC of the forward's x
//   params            the C ABI's backward gets them, and the engine refuses weights whose
//                     keyed MAC differs from the forward's
//   input_h, input_c, sequence_lengths
//                     byte for byte against the copies here (and the lengths again by the C
//                     ABI, which records their keyed MAC)
//   shapes, attributes, layout, dtype
//                     against the header, field by field (and the descriptor's fields again by
//                     the C ABI's sealed header)
// The header and the copies are the forward's record, so they are sealed: the seal is a keyed
// MAC (SipHash-2-4 under a random key drawn once per process) of the header but its seal, the
// copies, and the C ABI's header and the engine reserve's header — which carry the keyed MACs of
// x, the weights, h0, c0 and the mask.  A reserve whose header or copies were changed after the
// forward, or whose two parts come from two forwards, is refused before anything in it is used.
constexpr uint64_t kReserveMagic = 0x5346545552474331ull;  // "1CGRUTFS"
constexpr uint64_t kReserveVersion = 2;                    // 2: exact copies and a seal
constexpr size_t kAlign = 64;
constexpr size_t kHeaderBytes = 256;
constexpr size_t kSealOffset = kHeaderBytes - 8;
constexpr size_t kAbiHeaderBytes = 256;     // the C ABI's header, int64[32]
constexpr size_t kEngineHeaderBytes = 128;  // the engine reserve's header, int64[16]
constexpr size_t kAbiSealedBytes = kAbiHeaderBytes + kEngineHeaderBytes;
constexpr char kSealLabel[] = "cgru-tf-reserve";

constexpr size_t RoundUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// What a training forward records in front of the copies.
struct ReserveHeader {
  uint64_t magic, version, tf_bytes, abi_bytes;
  int64_t dtype, cell_mode, time_major, T, N, I, L, H, P, D, skip, has_lengths;
  double dropout;
  int64_t seed, seed2;
};
static_assert(sizeof(ReserveHeader) <= kSealOffset, "the reserve header outgrew its slot");

// Where the copies live (byte offsets in reserve_space) for a call: a closed form of its shapes.
struct CopyLayout {
  size_t h = kHeaderBytes, h_bytes = 0, c = 0, c_bytes = 0, lengths = 0, lengths_bytes = 0;
  size_t tf_bytes = 0;  // where the C ABI's reserve space starts
};

CopyLayout CopiesOf(const Call& call) {
  CopyLayout l;
  l.h_bytes = call.input_h->TotalBytes();
  l.c = l.h + RoundUp(l.h_bytes);
  l.c_bytes = call.input_c ? call.input_c->TotalBytes() : 0;
  l.lengths = l.c + RoundUp(l.c_bytes);
  l.lengths_bytes = sizeof(int32_t) * static_cast<size_t>(call.N);
  l.tf_bytes = l.lengths + RoundUp(l.lengths_bytes);
  return l;
}

template <typename T>
ReserveHeader RecordOf(const Call& call, const RnnAttrs& a, uint64_t abi_bytes) {
  const Topology& t = call.topo;
  return ReserveHeader{kReserveMagic, kReserveVersion, CopiesOf(call).tf_bytes, abi_bytes,
                       DataTypeToEnum<T>::v(), a.cell_mode, call.time_major, call.T, call.N,
                       t.I, t.L, t.H, t.P, t.D, t.skip, call.lengths != nullptr, a.dropout,
                       a.seed, a.seed2};
}

// Elements of T holding tf_bytes of header and copies and abi_bytes of C ABI reserve space.
template <typename T>
int64_t ReserveElements(uint64_t tf_bytes, uint64_t abi_bytes) {
  return static_cast<int64_t>((tf_bytes + abi_bytes + sizeof(T) - 1) / sizeof(T));
}

// SipHash-2-4 (J.-P. Aumasson and D. J. Bernstein, "SipHash: a fast short-input PRF", 2012): a
// pseudo-random function of a byte string under a 128-bit key, 64-bit result.  Fed in pieces.
class SipHash24 {
 public:
  SipHash24(uint64_t k0, uint64_t k1)
      : v0_(k0 ^ 0x736f6d6570736575ull), v1_(k1 ^ 0x646f72616e646f6dull),
        v2_(k0 ^ 0x6c7967656e657261ull), v3_(k1 ^ 0x7465646279746573ull) {}

  void Update(const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      word_ |= static_cast<uint64_t>(p[i]) << (8 * (length_ % 8));
      if (++length_ % 8 == 0) {
        Compress(word_);
        word_ = 0;
      }
    }
  }

  uint64_t Final() {
    Compress(word_ | (length_ << 56));  // the last 0…7 bytes and the length mod 256
    v2_ ^= 0xff;
    for (int i = 0; i < 4; ++i) Round();
    return v0_ ^ v1_ ^ v2_ ^ v3_;
  }

 private:
  static uint64_t Rotl(uint64_t v, int r) { return (v << r) | (v >> (64 - r)); }

  void Round() {
    v0_ += v1_; v1_ = Rotl(v1_, 13); v1_ ^= v0_; v0_ = Rotl(v0_, 32);
    v2_ += v3_; v3_ = Rotl(v3_, 16); v3_ ^= v2_;
    v0_ += v3_; v3_ = Rotl(v3_, 21); v3_ ^= v0_;
    v2_ += v1_; v1_ = Rotl(v1_, 17); v1_ ^= v2_; v2_ = Rotl(v2_, 32);
  }

  void Compress(uint64_t m) {
    v3_ ^= m;
    Round();
    Round();
    v0_ ^= m;
  }

  uint64_t v0_, v1_, v2_, v3_;
  uint64_t word_ = 0, length_ = 0;
};

// The seal's key: 128 random bits, drawn once per process (a forked child inherits them).
struct SealKey {
  uint64_t k0 = 0, k1 = 0;
  bool drawn = false;
};

const SealKey& ProcessSealKey() {
  static const SealKey key = [] {
    SealKey k;
    uint64_t words[2];
    if (getentropy(words, sizeof words) == 0) {
      k.k0 = words[0];
      k.k1 = words[1];
      k.drawn = true;
    }
    return k;
  }();
  return key;
}

// The seal of reserve_space's first tf_bytes + kAbiSealedBytes bytes (tf_bytes ≥ kHeaderBytes).
absl::Status SealOf(const uint8_t* reserve, size_t tf_bytes, uint64_t* seal) {
  const SealKey& key = ProcessSealKey();
  if (!key.drawn)
    return absl::InternalError(
        "reserve_space: the operating system gave no random bytes (getentropy failed) for the "
        "key that seals reserves; the training forward and the backprop need it");
  SipHash24 mac(key.k0, key.k1);
  mac.Update(kSealLabel, sizeof kSealLabel);
  mac.Update(reserve, kSealOffset);                             // the header but its seal
  mac.Update(reserve + kHeaderBytes, tf_bytes - kHeaderBytes);  // the copies
  mac.Update(reserve + tf_bytes, kAbiSealedBytes);              // the C ABI's, engine's headers
  *seal = mac.Final();
  return absl::OkStatus();
}

// Writes the header, the copies (padding zeroed) and the seal in front of the C ABI's reserve
// space, which the forward has filled.
template <typename T>
absl::Status WriteRecord(const Call& call, const RnnAttrs& a, uint64_t abi_bytes, Tensor* reserve) {
  uint8_t* base = reinterpret_cast<uint8_t*>(reserve->flat<T>().data());
  const CopyLayout l = CopiesOf(call);
  const ReserveHeader header = RecordOf<T>(call, a, abi_bytes);
  std::memset(base, 0, l.tf_bytes);
  std::memcpy(base, &header, sizeof header);
  std::memcpy(base + l.h, call.input_h->tensor_data().data(), l.h_bytes);
  if (call.input_c) std::memcpy(base + l.c, call.input_c->tensor_data().data(), l.c_bytes);
  if (call.lengths)
    std::memcpy(base + l.lengths, call.lengths->tensor_data().data(), l.lengths_bytes);
  const size_t used = l.tf_bytes + abi_bytes;  // the last element's unused bytes: zero
  std::memset(base + used, 0, reserve->TotalBytes() - used);
  uint64_t seal = 0;
  TF_RETURN_IF_ERROR(SealOf(base, l.tf_bytes, &seal));
  std::memcpy(base + kSealOffset, &seal, sizeof seal);
  return absl::OkStatus();
}

// "[i,j,k]": the position of element `flat` of an array of `shape` (row-major).
std::string IndexText(const TensorShape& shape, int64_t flat) {
  std::vector<int64_t> index(shape.dims());
  for (int d = shape.dims() - 1; d >= 0; --d) {
    index[d] = flat % shape.dim_size(d);
    flat /= shape.dim_size(d);
  }
  std::string out = "[";
  for (size_t d = 0; d < index.size(); ++d) absl::StrAppend(&out, d ? "," : "", index[d]);
  return out + "]";
}

// An element's value for a message: integers as they are, floats with every digit.
template <typename V>
std::string ValueText(V v) {
  if constexpr (std::is_integral<V>::value) {
    return absl::StrCat(v);
  } else {
    const bool wide = std::is_same<V, double>::value;
    char text[40];
    std::snprintf(text, sizeof text, "%.*g", wide ? 17 : 9,
                  wide ? static_cast<double>(v) : static_cast<double>(static_cast<float>(v)));
    return text;
  }
}

// The first of n elements where `given`, as the forward handed it to the C ABI (converted to
// To; as it is when From is To), differs bitwise from `saved` (n elements of To); -1 if none.
template <typename From, typename To>
int64_t FirstDifference(const From* given, const unsigned char* saved, int64_t n) {
  if constexpr (std::is_same<From, To>::value) {
    if (std::memcmp(given, saved, n * sizeof(To)) == 0) return -1;
    for (int64_t i = 0; i < n; ++i)
      if (std::memcmp(given + i, saved + i * sizeof(To), sizeof(To)) != 0) return i;
    return -1;
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const To v = Convert<To>(given[i]);
      if (std::memcmp(&v, saved + i * sizeof(To), sizeof(To)) != 0) return i;
    }
    return -1;
  }
}

// Refuses `given` (elements V) unless it equals, bit for bit, the forward's `saved` (elements S:
// V itself, or the compute type the forward converted it to), naming the first difference.
template <typename V, typename S>
absl::Status CompareWithForward(const char* name, const Tensor& given, const unsigned char* saved) {
  const V* values = given.flat<V>().data();
  const int64_t i = FirstDifference<V, S>(values, saved, given.NumElements());
  if (i < 0) return absl::OkStatus();
  S was;
  std::memcpy(&was, saved + i * sizeof(S), sizeof was);
  return absl::InvalidArgumentError(absl::StrCat(
      "reserve_space: comes from a forward call with a different ", name, " (", name,
      IndexText(given.shape(), i), " is ", ValueText(values[i]), " here, ", ValueText(was),
      " in the forward); pass the ", name, " of the forward that wrote reserve_space"));
}

const char kInferenceReserve[] =
    "reserve_space: empty — it comes from a forward with is_training=False, which saves "
    "nothing; run the forward with is_training=True to backprop";
const char kUnsealed[] =
    "reserve_space: its record of the forward does not verify: changed after the forward that "
    "wrote it, pieced together from two reserves, or written in another process (a "
    "reserve_space is valid in the process that made it and its forked children); pass the "
    "reserve_space of the matching training forward";

// The seal of the header r read from reserve_space's `size` bytes at `base`: the regions it
// covers must lie inside, and it must verify.
absl::Status CheckSeal(const uint8_t* base, size_t size, const ReserveHeader& r) {
  if (r.tf_bytes < kHeaderBytes || r.tf_bytes % kAlign != 0 || r.tf_bytes > size ||
      size - r.tf_bytes < kAbiSealedBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: bad header (its C ABI reserve space would start at byte ", r.tf_bytes,
        " of ", size, "); pass the reserve_space of the matching training forward"));
  uint64_t seal = 0, stored = 0;
  TF_RETURN_IF_ERROR(SealOf(base, r.tf_bytes, &seal));
  std::memcpy(&stored, base + kSealOffset, sizeof stored);
  if (seal != stored) return absl::InvalidArgumentError(kUnsealed);
  return absl::OkStatus();
}

// The forward's recorded shapes and attributes r (verified) against this call's, want.
template <typename T>
absl::Status CheckRecordedCall(const ReserveHeader& r, const ReserveHeader& want,
                               const Tensor& reserve, const Call& call, const RnnAttrs& a) {
  if (r.time_major != want.time_major)
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: the forward ran with a different layout (time_major=",
        r.time_major ? "True" : "False", ") than this backprop call (time_major=",
        want.time_major ? "True" : "False", ")"));
  const int64_t elements = ReserveElements<T>(want.tf_bytes, want.abi_bytes);
  if (r.dtype != want.dtype || r.cell_mode != want.cell_mode || r.T != want.T || r.N != want.N ||
      r.I != want.I || r.L != want.L || r.H != want.H || r.P != want.P || r.D != want.D ||
      r.skip != want.skip || r.tf_bytes != want.tf_bytes || r.abi_bytes != want.abi_bytes ||
      reserve.NumElements() != elements)
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: expected ", elements, " elements for this call (", Describe(a, call.topo),
        ", max_seq_length=", call.T, ", batch_size=", call.N, ", ",
        tensorflow::DataTypeString(DataTypeToEnum<T>::v()), "), got ", reserve.NumElements(),
        " of a forward with other sizes or attributes (from a different call?)"));
  if (r.dropout != want.dropout)
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: the forward ran with a different dropout than this backprop call (",
        r.dropout, " vs ", want.dropout, ")"));
  if (want.dropout > 0 && (r.seed != want.seed || r.seed2 != want.seed2))
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: the forward ran with a different ", r.seed != want.seed ? "seed" : "seed2",
        " than this backprop call (", r.seed != want.seed ? r.seed : r.seed2, " vs ",
        r.seed != want.seed ? want.seed : want.seed2, ")"));
  if (r.has_lengths != want.has_lengths)
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: the forward ran ", r.has_lengths ? "with" : "without",
        " sequence_lengths (CudnnRNNV3 takes them) and this backprop call ",
        want.has_lengths ? "with" : "without", " them"));
  return absl::OkStatus();
}

// Where the C ABI keeps its copy of the forward's x, in its reserve space at `abi` of abi_bytes:
// the regions header, engine, x, dw follow each other 64-byte aligned, so x and dw are a closed
// form counted from the end; the C ABI's header slots 4…7 must say the same.
template <typename C>
absl::Status SavedInputOffset(const uint8_t* abi, const Call& call, uint64_t abi_bytes,
                              uint64_t weight_bytes, size_t* x_offset) {
  const uint64_t x_bytes = static_cast<uint64_t>(call.T * call.N * call.topo.I) * sizeof(C);
  const uint64_t tail = RoundUp(x_bytes) + RoundUp(weight_bytes);
  if (abi_bytes < kAbiSealedBytes + tail)
    return absl::InternalError(absl::StrCat(
        "cgru_get_temp_space_sizes: a training reserve space of ", abi_bytes, " bytes cannot "
        "hold x (", x_bytes, " bytes) and dw (", weight_bytes, "); please report"));
  const int64_t dw = static_cast<int64_t>(abi_bytes - RoundUp(weight_bytes));
  const int64_t want[4] = {static_cast<int64_t>(kAbiHeaderBytes),
                           dw - static_cast<int64_t>(RoundUp(x_bytes)), dw,
                           static_cast<int64_t>(abi_bytes)};
  int64_t got[4];
  std::memcpy(got, abi + 4 * sizeof(int64_t), sizeof got);
  if (!std::equal(got, got + 4, want))
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: its C ABI reserve space has the region offsets (engine, x, dw, total) [",
        got[0], ", ", got[1], ", ", got[2], ", ", got[3], "] where this library expects [",
        want[0], ", ", want[1], ", ", want[2], ", ", want[3], "]: written by another cgru "
        "build; run the forward and the backprop with one"));
  *x_offset = static_cast<size_t>(want[1]);
  return absl::OkStatus();
}

// Refuses a reserve_space that is not the one a training forward wrote for this call: the
// header, its seal, the recorded call, then input_h, input_c, sequence_lengths and input
// themselves.  (params: the C ABI's backward checks them.)
template <typename T>
absl::Status CheckReserve(const Tensor& reserve, const Call& call, const RnnAttrs& a,
                          uint64_t abi_bytes, uint64_t weight_bytes) {
  using C = ComputeT<T>;
  if (reserve.dims() == 0) return absl::InvalidArgumentError(kInferenceReserve);
  auto bytes = reserve.tensor_data();
  const uint8_t* base = reinterpret_cast<const uint8_t*>(bytes.data());
  if (reserve.dims() != 1 || bytes.size() < kHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "reserve_space: shape ", ShapeText(reserve.shape()), " (", bytes.size(), " bytes) is too "
        "small for a cgru reserve space (from a different call?)"));
  ReserveHeader r;
  std::memcpy(&r, base, sizeof r);
  if (r.magic != kReserveMagic || r.version != kReserveVersion)
    return absl::InvalidArgumentError(
        "reserve_space: not a cgru reserve space (bad header); pass the reserve_space of the "
        "matching training forward");
  TF_RETURN_IF_ERROR(CheckSeal(base, bytes.size(), r));
  TF_RETURN_IF_ERROR(CheckRecordedCall<T>(r, RecordOf<T>(call, a, abi_bytes), reserve, call, a));
  const CopyLayout l = CopiesOf(call);
  size_t x_offset = 0;
  TF_RETURN_IF_ERROR(
      SavedInputOffset<C>(base + l.tf_bytes, call, abi_bytes, weight_bytes, &x_offset));
  TF_RETURN_IF_ERROR(CompareWithForward<T, T>("input_h", *call.input_h, base + l.h));
  if (call.input_c)
    TF_RETURN_IF_ERROR(CompareWithForward<T, T>("input_c", *call.input_c, base + l.c));
  if (call.lengths)
    TF_RETURN_IF_ERROR(
        CompareWithForward<int32_t, int32_t>("sequence_lengths", *call.lengths, base + l.lengths));
  return CompareWithForward<T, C>("input", *call.input, base + l.tf_bytes + x_offset);
}

// The C ABI's reserve space for the backward calls, which write into it: reserve_space's own
// buffer when TF can forward it (nothing else refers to it), else a private copy.
template <typename T>
absl::Status WritableReserve(OpKernelContext* ctx, const char* name, size_t tf_bytes,
                             Tensor* holder, uint8_t** abi) {
  int start = 0, stop = 0;
  TF_RETURN_IF_ERROR(ctx->op_kernel().InputRange(name, &start, &stop));
  const Tensor& reserve = ctx->input(start);
  std::unique_ptr<Tensor> forwarded = ctx->forward_input(
      start, OpKernelContext::Params::kNoReservation, DataTypeToEnum<T>::v(), reserve.shape(),
      ctx->input_memory_type(start), ctx->input_alloc_attr(start));
  if (forwarded) {
    *holder = *forwarded;
  } else {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DataTypeToEnum<T>::v(), reserve.shape(), holder));
    std::memcpy(holder->flat<T>().data(), reserve.flat<T>().data(), reserve.TotalBytes());
  }
  *abi = reinterpret_cast<uint8_t*>(holder->flat<T>().data()) + tf_bytes;
  return absl::OkStatus();
}

// ---- the forward ops: CudnnRNN, CudnnRNNV2, CudnnRNNV3 ---------------------------------------
template <typename T>
class ForwardOp : public OpKernel {
 public:
  using C = ComputeT<T>;

  ForwardOp(OpKernelConstruction* ctx, int version) : OpKernel(ctx), version_{version} {
    OP_REQUIRES_OK(ctx, ReadRnnAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("is_training", &is_training_));
    if (ctx->HasAttr("time_major")) OP_REQUIRES_OK(ctx, ctx->GetAttr("time_major", &time_major_));
  }

  void Compute(OpKernelContext* ctx) override {
    Call call;
    OP_REQUIRES_OK(ctx, PrepareCall<T>(ctx, attrs_, version_, time_major_, &sizes_, &call));
    const bool lstm = attrs_.has_cell_state();
    const bool swap = call.swap_states();
    Tensor x_stage, h_stage, c_stage, p_stage;
    const C *x = nullptr, *hx = nullptr, *cx = nullptr, *w = nullptr;
    OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *call.input, false, &x_stage, &x));
    OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *call.input_h, swap, &h_stage, &hx));
    if (lstm) OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *call.input_c, swap, &c_stage, &cx));
    OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *call.params, false, &p_stage, &w));

    Tensor *output = nullptr, *output_h = nullptr, *output_c = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, call.output_shape, &output));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, call.h_shape, &output_h));
    if (lstm)
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, call.c_shape, &output_c));
    else
      OP_REQUIRES_OK(ctx, ZeroOutput<T>(ctx, 2, TensorShape({})));
    OutputStage<T> y, hy, cy;
    OP_REQUIRES_OK(ctx, y.Init(ctx, output, false));
    OP_REQUIRES_OK(ctx, hy.Init(ctx, output_h, swap));
    if (lstm) OP_REQUIRES_OK(ctx, cy.Init(ctx, output_c, swap));

    const cgru_fwd_mode_t mode = is_training_ ? CGRU_FWD_MODE_TRAINING : CGRU_FWD_MODE_INFERENCE;
    size_t work_bytes = 0, abi_bytes = 0;
    OP_REQUIRES_OK(ctx, sizes_.TempSizes(call.desc, mode, call.T, call.N, &work_bytes, &abi_bytes));
    Tensor work;
    void* work_data = nullptr;
    if (work_bytes) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_UINT8,
                                             TensorShape({static_cast<int64_t>(work_bytes)}), &work));
      work_data = work.flat<uint8_t>().data();
    }
    Tensor* reserve = nullptr;
    uint8_t* abi = nullptr;
    if (is_training_) {
      const size_t tf_bytes = CopiesOf(call).tf_bytes;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(
                              3, TensorShape({ReserveElements<T>(tf_bytes, abi_bytes)}), &reserve));
      abi = reinterpret_cast<uint8_t*>(reserve->flat<T>().data()) + tf_bytes;
    } else {
      OP_REQUIRES_OK(ctx, ZeroOutput<T>(ctx, 3, TensorShape({})));
    }

    OP_REQUIRES_OK(ctx, FromCgru(cgru_rnn_forward_ex(
                                     &call.desc, mode, call.layout(), static_cast<int32_t>(call.T),
                                     static_cast<int32_t>(call.N), call.seq_lengths(), x, y.data(),
                                     hx, hy.data(), cx, lstm ? cy.data() : nullptr,
                                     call.params->NumElements() * sizeof(C), w, work_bytes,
                                     work_data, abi_bytes, abi),
                                 "cgru_rnn_forward_ex"));
    y.Finish();
    hy.Finish();
    if (lstm) cy.Finish();
    if (is_training_) OP_REQUIRES_OK(ctx, WriteRecord<T>(call, attrs_, abi_bytes, reserve));
    if (version_.has_host_reserved()) {
      // V2's training forward writes its algorithm choice (two int8) there; V3 and inference: []
      bool two = version_.version == 2 && is_training_;
      OP_REQUIRES_OK(ctx, ZeroOutput<int8_t>(ctx, 4, two ? TensorShape({2}) : TensorShape({})));
    }
  }

 private:
  OpVersion version_;
  RnnAttrs attrs_;
  bool is_training_ = true;
  bool time_major_ = true;
  SizeQueries sizes_;
};

template <typename T, int kVersion>
class ForwardOpV : public ForwardOp<T> {
 public:
  explicit ForwardOpV(OpKernelConstruction* ctx) : ForwardOp<T>(ctx, kVersion) {}
};

// ---- the backprop ops: CudnnRNNBackprop, CudnnRNNBackpropV2, CudnnRNNBackpropV3 --------------
absl::Status CheckLike(OpKernelContext* ctx, const char* name, const TensorShape& want,
                       const Tensor** out) {
  TF_RETURN_IF_ERROR(ctx->input(name, out));
  if ((*out)->shape() != want)
    return absl::InvalidArgumentError(absl::StrCat("Invalid ", name, " shape: ",
                                                   ShapeText((*out)->shape()), " ", ShapeText(want),
                                                   " (", name, ": expected ", ShapeText(want), ")"));
  return absl::OkStatus();
}

template <typename T>
class BackpropOp : public OpKernel {
 public:
  using C = ComputeT<T>;

  BackpropOp(OpKernelConstruction* ctx, int version) : OpKernel(ctx), version_{version} {
    OP_REQUIRES_OK(ctx, ReadRnnAttrs(ctx, &attrs_));
    if (ctx->HasAttr("time_major")) OP_REQUIRES_OK(ctx, ctx->GetAttr("time_major", &time_major_));
  }

  void Compute(OpKernelContext* ctx) override {
    Call call;
    OP_REQUIRES_OK(ctx, PrepareCall<T>(ctx, attrs_, version_, time_major_, &sizes_, &call));
    const bool lstm = attrs_.has_cell_state();
    const bool swap = call.swap_states();
    const Tensor *output, *output_h, *output_c, *dy_t, *dhy_t, *dcy_t = nullptr;
    OP_REQUIRES_OK(ctx, CheckLike(ctx, "output", call.output_shape, &output));
    OP_REQUIRES_OK(ctx, CheckLike(ctx, "output_h", call.h_shape, &output_h));
    OP_REQUIRES_OK(ctx, CheckLike(ctx, "output_backprop", call.output_shape, &dy_t));
    OP_REQUIRES_OK(ctx, CheckLike(ctx, "output_h_backprop", call.h_shape, &dhy_t));
    if (lstm) {
      OP_REQUIRES_OK(ctx, CheckLike(ctx, "output_c", call.c_shape, &output_c));
      OP_REQUIRES_OK(ctx, CheckLike(ctx, "output_c_backprop", call.c_shape, &dcy_t));
    }

    size_t work_bytes = 0, abi_bytes = 0;
    OP_REQUIRES_OK(ctx, sizes_.TempSizes(call.desc, CGRU_FWD_MODE_TRAINING, call.T, call.N,
                                         &work_bytes, &abi_bytes));
    const size_t weight_bytes = call.params->NumElements() * sizeof(C);
    const Tensor* reserve_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->input("reserve_space", &reserve_t));
    OP_REQUIRES_OK(ctx, CheckReserve<T>(*reserve_t, call, attrs_, abi_bytes, weight_bytes));
    Tensor reserve;
    uint8_t* abi = nullptr;
    OP_REQUIRES_OK(ctx, WritableReserve<T>(ctx, "reserve_space", CopiesOf(call).tf_bytes,
                                           &reserve, &abi));

    Tensor dy_stage, dhy_stage, dcy_stage, p_stage;
    const C *dy = nullptr, *dhy = nullptr, *dcy = nullptr, *w = nullptr;
    OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *dy_t, false, &dy_stage, &dy));
    OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *dhy_t, swap, &dhy_stage, &dhy));
    if (lstm) OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *dcy_t, swap, &dcy_stage, &dcy));
    OP_REQUIRES_OK(ctx, StageInput<T>(ctx, *call.params, false, &p_stage, &w));

    Tensor *dx_t = nullptr, *dhx_t = nullptr, *dcx_t = nullptr, *dw_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, call.input->shape(), &dx_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, call.h_shape, &dhx_t));
    if (lstm)
      OP_REQUIRES_OK(ctx, ctx->allocate_output(2, call.c_shape, &dcx_t));
    else
      OP_REQUIRES_OK(ctx, ZeroOutput<T>(ctx, 2, TensorShape({})));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, call.params->shape(), &dw_t));
    OutputStage<T> dx, dhx, dcx, dw;
    OP_REQUIRES_OK(ctx, dx.Init(ctx, dx_t, false));
    OP_REQUIRES_OK(ctx, dhx.Init(ctx, dhx_t, swap));
    if (lstm) OP_REQUIRES_OK(ctx, dcx.Init(ctx, dcx_t, swap));
    OP_REQUIRES_OK(ctx, dw.Init(ctx, dw_t, false));

    Tensor work;
    void* work_data = nullptr;
    if (work_bytes) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_UINT8,
                                             TensorShape({static_cast<int64_t>(work_bytes)}), &work));
      work_data = work.flat<uint8_t>().data();
    }
    const int32_t T_ = static_cast<int32_t>(call.T), N_ = static_cast<int32_t>(call.N);
    OP_REQUIRES_OK(ctx, FromCgru(cgru_rnn_backward_data_ex(
                                     &call.desc, call.layout(), T_, N_, call.seq_lengths(), dy,
                                     dx.data(), dhy, dhx.data(), dcy, lstm ? dcx.data() : nullptr,
                                     weight_bytes, w, work_bytes, work_data, abi_bytes, abi),
                                 "cgru_rnn_backward_data_ex"));
    OP_REQUIRES_OK(ctx, FromCgru(cgru_rnn_backward_weights(
                                     &call.desc, CGRU_WGRAD_MODE_SET, call.layout(), T_, N_,
                                     call.seq_lengths(), weight_bytes, dw.data(), work_bytes,
                                     work_data, abi_bytes, abi),
                                 "cgru_rnn_backward_weights"));
    dx.Finish();
    dhx.Finish();
    if (lstm) dcx.Finish();
    dw.Finish();
  }

 private:
  OpVersion version_;
  RnnAttrs attrs_;
  bool time_major_ = true;
  SizeQueries sizes_;
};

template <typename T, int kVersion>
class BackpropOpV : public BackpropOp<T> {
 public:
  explicit BackpropOpV(OpKernelConstruction* ctx) : BackpropOp<T>(ctx, kVersion) {}
};

// ---- registration ----------------------------------------------------------------------------
using tensorflow::DEVICE_CPU;
using tensorflow::register_kernel::Name;

#define CGRU_REGISTER_PARAMS_SIZE(T)                                                      \
  REGISTER_KERNEL_BUILDER(Name("CudnnRNNParamsSize")                                      \
                              .Device(DEVICE_CPU)                                         \
                              .HostMemory("num_layers")                                   \
                              .HostMemory("num_units")                                    \
                              .HostMemory("input_size")                                   \
                              .HostMemory("params_size")                                  \
                              .TypeConstraint<T>("T")                                     \
                              .TypeConstraint<int32_t>("S"),                              \
                          ParamsSizeOp<T, int32_t>);                                      \
  REGISTER_KERNEL_BUILDER(Name("CudnnRNNParamsSize")                                      \
                              .Device(DEVICE_CPU)                                         \
                              .HostMemory("num_layers")                                   \
                              .HostMemory("num_units")                                    \
                              .HostMemory("input_size")                                   \
                              .HostMemory("params_size")                                  \
                              .TypeConstraint<T>("T")                                     \
                              .TypeConstraint<int64_t>("S"),                              \
                          ParamsSizeOp<T, int64_t>);

#define CGRU_REGISTER_CANONICAL(NAME, KERNEL, T)                                          \
  REGISTER_KERNEL_BUILDER(Name(NAME)                                                      \
                              .Device(DEVICE_CPU)                                         \
                              .HostMemory("num_layers")                                   \
                              .HostMemory("num_units")                                    \
                              .HostMemory("input_size")                                   \
                              .TypeConstraint<T>("T"),                                    \
                          KERNEL<T>);

#define CGRU_REGISTER_RNN(T)                                                              \
  CGRU_REGISTER_PARAMS_SIZE(T)                                                            \
  CGRU_REGISTER_CANONICAL("CudnnRNNParamsToCanonical", ParamsToCanonicalOp, T)            \
  CGRU_REGISTER_CANONICAL("CudnnRNNParamsToCanonicalV2", ParamsToCanonicalOp, T)          \
  CGRU_REGISTER_CANONICAL("CudnnRNNCanonicalToParams", CanonicalToParamsOp, T)            \
  CGRU_REGISTER_CANONICAL("CudnnRNNCanonicalToParamsV2", CanonicalToParamsOp, T)          \
  REGISTER_KERNEL_BUILDER(Name("CudnnRNN").Device(DEVICE_CPU).TypeConstraint<T>("T"),     \
                          ForwardOpV<T, 1>);                                              \
  REGISTER_KERNEL_BUILDER(Name("CudnnRNNV2")                                              \
                              .Device(DEVICE_CPU)                                         \
                              .HostMemory("host_reserved")                                \
                              .TypeConstraint<T>("T"),                                    \
                          ForwardOpV<T, 2>);                                              \
  REGISTER_KERNEL_BUILDER(Name("CudnnRNNV3")                                              \
                              .Device(DEVICE_CPU)                                         \
                              .HostMemory("sequence_lengths")                             \
                              .HostMemory("host_reserved")                                \
                              .TypeConstraint<T>("T"),                                    \
                          ForwardOpV<T, 3>);                                              \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("CudnnRNNBackprop").Device(DEVICE_CPU).TypeConstraint<T>("T"),                 \
      BackpropOpV<T, 1>);                                                                 \
  REGISTER_KERNEL_BUILDER(Name("CudnnRNNBackpropV2")                                      \
                              .Device(DEVICE_CPU)                                         \
                              .HostMemory("host_reserved")                                \
                              .TypeConstraint<T>("T"),                                    \
                          BackpropOpV<T, 2>);                                             \
  REGISTER_KERNEL_BUILDER(Name("CudnnRNNBackpropV3")                                      \
                              .Device(DEVICE_CPU)                                         \
                              .HostMemory("sequence_lengths")                             \
                              .HostMemory("host_reserved")                                \
                              .TypeConstraint<T>("T"),                                    \
                          BackpropOpV<T, 3>);

CGRU_REGISTER_RNN(float)
CGRU_REGISTER_RNN(double)
CGRU_REGISTER_RNN(Eigen::half)
CGRU_REGISTER_RNN(Eigen::bfloat16)

#undef CGRU_REGISTER_RNN
#undef CGRU_REGISTER_CANONICAL
#undef CGRU_REGISTER_PARAMS_SIZE

}  // namespace cgru_tf
