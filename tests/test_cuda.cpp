#include "backend_suites.hpp"
GDN_INSTANTIATE_BACKEND_SUITES(Cuda, gdn::Backend::kCuda)
