// Fixture of LayerOrder.DetectsAnUpwardInclude: a core header that includes a train header,
// which tools/check_layers.cmake must refuse. Never compiled.
#pragma once
#include "core/tensor.h"
#include "train/trainer.h"
