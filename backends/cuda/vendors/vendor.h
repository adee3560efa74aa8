// One source, two vendors: compiled as HIP (GDN_HIP) the HIP header maps the
// CUDA runtime names and sets the HIP code paths; otherwise CUDA's.
#pragma once

#if defined(GDN_HIP)
#include "hip.h"
#else
#include "cuda.h"
#endif
