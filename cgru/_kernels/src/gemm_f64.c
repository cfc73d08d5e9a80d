/* The packed GEMM in float64, every level's version (simd.h). */
#define CGRU_IMPL_GEMM_F64 1
#include "simd.h"
