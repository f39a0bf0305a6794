// The CPU grid's stand-in for CUDA's <cuda_runtime.h> (on the include path of RINGZERO_CPU_GRID builds only).
#pragma once
#include "cuda/cpu_grid/grid.h"
