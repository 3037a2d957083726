// SIMT emulator stand-in for <cuda_fp16.h> (tests/simt/simt.h holds the definitions).
#pragma once
#include "simt/simt.h"
