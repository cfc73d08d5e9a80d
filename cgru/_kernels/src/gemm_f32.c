/* The packed GEMM in float32, every level's version, and the machine's ISA level (simd.h). */
#define CGRU_IMPL_GEMM_F32 1
#define CGRU_IMPL_ISA 1
#include "simd.h"
