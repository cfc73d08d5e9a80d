/* The fused gate rows in float64, every level's version (gates.h), and the bulk sigmoid and
 * tanh in both dtypes (simd.h). */
#define CGRU_IMPL_GATES_F64 1
#define CGRU_IMPL_VMAP 1
#include "gates.h"
