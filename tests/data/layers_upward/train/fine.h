// Fixture of LayerOrder.DetectsAnUpwardInclude: includes that point down pass. Never compiled.
#pragma once
#include "core/upward.h"
