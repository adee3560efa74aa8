#include "backend_suites.hpp"
GDN_INSTANTIATE_BACKEND_SUITES(Host, gdn::Backend::kHost)
