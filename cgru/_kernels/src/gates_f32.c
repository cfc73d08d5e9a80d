/* The fused gate rows in float32, every level's version (gates.h). */
#define CGRU_IMPL_GATES_F32 1
#include "gates.h"
