// The CPU AdamW kernel (optim/adamw_cpu.cpp), in layers/cpu_kernels.h's conventions.
#pragma once
#include <cstddef>

#include "core/dtype.h"

namespace st::cpu {

// master/m/v: the optimizer's format (FP32, or FP64 in the reference mode). param: the
// compute copy (null when it is master itself), receiving round_fmt(master).
template <class T>
void adamw_update(T* master, T* param, const T* grad, T* m, T* v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step,
                  float grad_scale, DType fmt);

}  // namespace st::cpu
