#include "backend_suites.hpp"
GDN_INSTANTIATE_BACKEND_SUITES(Hip, gdn::Backend::kHip)
