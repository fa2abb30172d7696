// Numbers as text, for the estimator's tables: parameter counts exact with
// commas ("1,463,270,400") or short as model sizes are quoted ("1.46B"), and
// one decimal unit for a table's bytes.
#pragma once

#include <cstddef>
#include <string>

namespace zest {

std::string with_commas(size_t n);
std::string short_count(size_t n);  // 7.50B, 13.40M

// One decimal (SI) unit for a whole table, so columns compare at a glance;
// GB for anything from 1e9 bytes up, as the ZeRO paper gives its figures.
struct SiUnit {
  double scale;
  const char* name;
};
SiUnit unit_for(double largest_bytes);

}  // namespace zest
