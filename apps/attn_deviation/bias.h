// attn_deviation bias: the report and CSV of the tied-maximum bias experiment.
#pragma once
#include <string>

#include "attention/experiments.h"

namespace st::attn_tool {

void print_bias(const BiasConfig& bc, const BiasReport& rep, const std::string& cmdline);
void write_bias_csv(const std::string& path, const BiasConfig& bc, const BiasReport& rep,
                    const std::string& cmdline);

}  // namespace st::attn_tool
