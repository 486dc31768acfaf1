#include "tp/parallel_state.h"

#include <map>

#include <fmt/format.h>

#include "runtime/errors.h"

namespace cubesim::tp {

namespace {
struct RankState {
  int tp_size = 0;
  rt::ProcessGroup* tp_group = nullptr;
  rt::ProcessGroup* dp_group = nullptr;
};
struct State {
  std::map<int, RankState> ranks;
};

RankState& mine(const char* what, bool must_be_initialized = true) {
  rt::Context& ctx = rt::Context::current(what);
  RankState& s = ctx.extension<State>("tp.parallel_state").ranks[rt::Context::current_rank(what)];
  if (must_be_initialized && s.tp_size == 0) {
    throw rt::RuntimeError(fmt::format("{}: model parallel is not initialized on rank {}; call "
                                       "tp.initialize_model_parallel(tp_size) first on every rank",
                                       what, rt::Context::current_rank(what)));
  }
  return s;
}
}  // namespace

void initialize_model_parallel(int tp) {
  rt::Context& ctx = rt::Context::current("initialize_model_parallel");
  const int rank = rt::Context::current_rank("initialize_model_parallel");
  const int world = ctx.world_size();
  if (tp < 1 || world % tp != 0) {
    throw rt::RuntimeError(fmt::format("initialize_model_parallel({}): the tensor-parallel size must divide the world "
                                       "size {} (valid: the divisors of {})",
                                       tp, world, world));
  }
  RankState& s = mine("initialize_model_parallel", false);
  if (s.tp_size != 0) {
    throw rt::RuntimeError(fmt::format("initialize_model_parallel: rank {} is already initialized (tp {}); call "
                                       "destroy_model_parallel() first",
                                       rank, s.tp_size));
  }
  std::vector<int> tp_ranks, dp_ranks;
  const int base = rank / tp * tp;
  for (int i = 0; i < tp; ++i) tp_ranks.push_back(base + i);
  for (int i = rank % tp; i < world; i += tp) dp_ranks.push_back(i);
  s.tp_size = tp;
  s.tp_group = &ctx.new_group(tp_ranks);
  s.dp_group = &ctx.new_group(dp_ranks);
}

bool model_parallel_is_initialized() { return mine("model_parallel_is_initialized", false).tp_size != 0; }

void destroy_model_parallel() { mine("destroy_model_parallel", false) = RankState{}; }

int get_tensor_model_parallel_rank() {
  RankState& s = mine("get_tensor_model_parallel_rank");
  return s.tp_group->index_of(rt::Context::current_rank("get_tensor_model_parallel_rank"));
}
int get_tensor_model_parallel_world_size() { return mine("get_tensor_model_parallel_world_size").tp_size; }
rt::ProcessGroup& get_tensor_model_parallel_group() { return *mine("get_tensor_model_parallel_group").tp_group; }
int get_data_parallel_rank() {
  RankState& s = mine("get_data_parallel_rank");
  return s.dp_group->index_of(rt::Context::current_rank("get_data_parallel_rank"));
}
int get_data_parallel_world_size() { return mine("get_data_parallel_world_size").dp_group->size(); }
rt::ProcessGroup& get_data_parallel_group() { return *mine("get_data_parallel_group").dp_group; }

}  // namespace cubesim::tp
