// SIMT emulator stand-in for <cuda_runtime.h> (tests/simt/simt.h holds the definitions).
#pragma once
#include "simt/simt.h"
