// Plans of attention.backend cudnn (cuda/attention_cudnn.cu): cuDNN's heuristics, the engine
// configuration chosen, its workspace and what cuDNN's numerical notes say of it; the cache
// of plans in the backend's cuDNN state; the same planning without a GPU
// (cudnn_plan_deviceless, for a device that a cuDNN device-properties JSON describes).
//
// Plans (descriptors, engine choice, workspace size) are built once per (B, T, NH, HS,
// format) and cached in the backend's cuDNN state, shared by every cudnn layer; the first
// build of a shape compiles cuDNN's kernels (runtime-compiled engines) and can take seconds.
//
// Determinism: the graph asks for the deterministic backward by its shape
// (cuda/cudnn_graph.cu). Whether the engine cuDNN then picks says it is deterministic is read
// from the engine's numerical notes (CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) and reported by
// cudnn_attention_describe; a configuration that would need a non-deterministic engine is
// taken (it is the only one there is) and says so on stderr once (cuda/attention_cudnn.cu).
// On Blackwell (SM 10.x) cudnn-frontend pins a specific engine for determinism; this file
// does not (the target machines are Hopper), so there the notes decide what is reported.
#if defined(ST_WITH_CUDNN)
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/attention_cuda.h"
#include "cuda/cuda_backend.h"
#include "cuda/cudnn_internal.h"

namespace st {
namespace cudnn_impl {

std::string version_string(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

[[noreturn]] void cudnn_fail(cudnnStatus_t s, const char* what, const std::string& where) {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  for (char* c = last; *c; ++c)
    if (*c == '\n') *c = ' ';
  fail("cuDNN attention (", where, "): ", what, " failed: ", cudnnGetErrorString(s),
       last[0] ? std::string(" (") + last + ")" : std::string());
}

namespace {

// The engine behind an engine configuration: its global index and whether cuDNN's numerical
// notes call it non-deterministic (-1 / false where cuDNN will not say).
struct EngineInfo {
  int64_t engine = -1;
  bool nondeterministic = false;
};
EngineInfo engine_info(cudnnBackendDescriptor_t cfg) {
  EngineInfo r;
  cudnnBackendDescriptor_t engine = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS)
    return r;
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &engine) == CUDNN_STATUS_SUCCESS) {
    cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                             &r.engine);
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t nn = 0;
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn,
                                 notes) == CUDNN_STATUS_SUCCESS)
      for (int64_t i = 0; i < nn; ++i)
        r.nondeterministic |= notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
  }
  cudnnBackendDestroyDescriptor(engine);
  return r;
}

// The engine configurations cuDNN's heuristics (mode A) propose for graph g, best first,
// after cuDNN's own support checks. With devprop (a device-properties descriptor) they are
// for the device it describes rather than the current GPU (cuDNN >= 9.8).
std::vector<Desc> heuristic_configs(const Desc& g, const std::string& what,
                                    cudnnBackendDescriptor_t devprop) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what + " heuristics");
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  heur.desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (devprop) heur.set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
  heur.finalize();
  int64_t count = 0;
  ST_CUDNN_DO(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
              what + " heuristics");
  std::vector<Desc> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    cfgs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, what + " engine config");
    raw.push_back(cfgs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    ST_CUDNN_DO(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
                what + " heuristics");
  cfgs.resize(static_cast<size_t>(std::max<int64_t>(0, std::min(got, count))));
  return cfgs;
}

// One attempt to finalize an execution plan of cfg (on handle's GPU, or for devprop's).
struct PlanTry {
  Desc plan;  // empty when it failed
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  std::string error;  // cuDNN's status and last message when it failed
};
PlanTry try_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t devprop, const Desc& cfg,
                 const std::string& what) {
  PlanTry t;
  cudnnBackendDescriptor_t plan_d = nullptr;
  t.status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan_d);
  cudnnBackendDescriptor_t cfg_d = cfg.get();
  if (t.status == CUDNN_STATUS_SUCCESS)
    t.status = handle ? cudnnBackendSetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                                 CUDNN_TYPE_HANDLE, 1, &handle)
                      : cudnnBackendSetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
  if (t.status == CUDNN_STATUS_SUCCESS)
    t.status = cudnnBackendSetAttribute(plan_d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg_d);
  if (t.status == CUDNN_STATUS_SUCCESS) t.status = cudnnBackendFinalize(plan_d);
  if (t.status != CUDNN_STATUS_SUCCESS) {
    char msg[512] = {0};
    cudnnGetLastErrorString(msg, sizeof msg);
    for (char* c = msg; *c; ++c)
      if (*c == '\n') *c = ' ';
    t.error = std::string(cudnnGetErrorString(t.status)) + (msg[0] ? std::string(": ") + msg : "");
    if (plan_d) cudnnBackendDestroyDescriptor(plan_d);
    return t;
  }
  t.plan = Desc::adopt(plan_d, what + " plan");
  return t;
}

int64_t workspace_of(const Desc& plan, const std::string& what) {
  int64_t n = 0, ws = 0;
  ST_CUDNN_DO(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &n, &ws),
              what + " workspace size");
  return ws;
}

}  // namespace

// Heuristics (mode A), then the first engine configuration whose plan finalizes.
Plan make_plan(cudnnHandle_t handle, std::unique_ptr<GraphBuilder> b, const std::string& what) {
  Plan p;
  p.graph = b->graph();
  p.builder = std::move(b);
  std::vector<Desc> cfgs = heuristic_configs(p.graph, what, nullptr);
  if (cfgs.empty())
    fail("cuDNN attention (", what, "): cuDNN's heuristics offer no engine for this graph "
         "(cuDNN ", version_string(cudnnGetVersion()), "); use flash");
  std::string last_error;
  for (Desc& cfg : cfgs) {
    ++p.configs_tried;
    PlanTry t = try_plan(handle, nullptr, cfg, what);
    if (!t.plan.get()) {
      last_error = t.error;
      continue;
    }
    p.config = std::move(cfg);
    p.plan = std::move(t.plan);
    break;
  }
  if (!p.plan.get())
    fail("cuDNN attention (", what, "): none of the ", cfgs.size(), " engine configurations "
         "cuDNN ", version_string(cudnnGetVersion()), " proposed could be finalized (last: ",
         last_error, "); use flash");
  p.workspace = workspace_of(p.plan, what);
  const EngineInfo e = engine_info(p.config.get());
  p.engine = e.engine;
  p.nondeterministic = e.nondeterministic;
  return p;
}

std::string plan_text(const Plan& p) {
  return "engine " + std::to_string(p.engine) + ", workspace " + std::to_string(p.workspace) +
         " B, " + (p.nondeterministic ? "NON-deterministic" : "deterministic") +
         " per cuDNN's numerical notes, " + std::to_string(p.builder->op_count()) + " ops, " +
         "engine config " + std::to_string(p.configs_tried) + " of heuristics mode A";
}

CudaBackend::CudnnState& state_of(CudaBackend& be) {
  auto& st = be.cudnn_state();
  if (!st) {
    auto s = std::make_shared<CudaBackend::CudnnState>();
    ST_CUDNN_DO(cudnnCreate(&s->handle), "handle");
    ST_CUDNN_DO(cudnnSetStream(s->handle, be.stream()), "handle");
    st = std::move(s);
  }
  return *st;
}

}  // namespace cudnn_impl

using namespace cudnn_impl;

std::string cudnn_version_text() {
  return "cuDNN " + version_string(cudnnGetVersion()) + " (built with " +
         version_string(CUDNN_VERSION) + ")";
}

CudnnDevicelessReport cudnn_plan_deviceless(const std::string& device_json, int B, int T,
                                            int NH, int HS, DType fmt, bool causal) {
  Desc dev(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
  dev.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
          static_cast<int64_t>(device_json.size()), device_json.data())
      .finalize();
  const Shape4 s{B, NH, T, HS};
  CudnnDevicelessReport r;
  r.version = version_string(cudnnGetVersion());
  for (const bool fwd : {true, false}) {
    const std::string what = std::string(fwd ? "forward" : "backward") + " deviceless";
    auto g = fwd ? forward_graph(nullptr, s, fmt, causal, what)
                 : backward_graph(nullptr, s, fmt, causal, what);
    const Desc graph = g->graph();
    auto& out = fwd ? r.forward : r.backward;
    for (const Desc& cfg : heuristic_configs(graph, what, dev.get())) {
      CudnnDevicelessConfig c;
      const EngineInfo e = engine_info(cfg.get());
      c.engine = e.engine;
      c.nondeterministic = e.nondeterministic;
      PlanTry t = try_plan(nullptr, dev.get(), cfg, what);
      c.finalized = t.plan.get() != nullptr;
      c.status = c.finalized ? "finalized" : t.error;
      if (c.finalized) c.workspace = workspace_of(t.plan, what);
      out.push_back(c);
    }
  }
  return r;
}

}  // namespace st

#endif  // ST_WITH_CUDNN
