// Parameter counts as text, for the estimator's tables: exact with commas
// ("1,463,270,400"), or short as model sizes are quoted ("1.46B").
#pragma once

#include <cstddef>
#include <string>

namespace zest {

std::string with_commas(size_t n);
std::string short_count(size_t n);  // 7.50B, 13.40M

}  // namespace zest
