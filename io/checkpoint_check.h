// Internal to io/checkpoint.cpp and io/checkpoint_check.cpp: the checks of a checkpoint
// state's values, which save_checkpoint and load_checkpoint run. Not part of the public
// header io/checkpoint.h.
#pragma once
#include <string>

#include "io/checkpoint.h"

namespace st::detail {

// Empty when the optimizer arrays are consistent (element size, equal sizes, shard fields),
// else what is wrong.
std::string check_arrays(const CheckpointState& s);
// The values of a structurally sound state (check_arrays passed): bounds and agreement
// between the records (the rules: checkpoint_check.cpp). Throws st::Error starting with
// `what`.
void check_values(const CheckpointState& s, const std::string& what);

}  // namespace st::detail
