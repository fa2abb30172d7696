#include "common/describe_model.h"

namespace examples {

zest::ModelDescription describe_model(const zest::ModelLayout& layout) {
  zest::ModelDescription model;
  for (const zest::UnitLayout& u : layout.units()) {
    zest::UnitDescription d;
    d.name = u.name;
    d.frozen = u.frozen;
    for (const zest::ParamLayout& p : u.params) d.param_numels.push_back(p.numel);
    model.units.push_back(std::move(d));
  }
  return model;
}

}  // namespace examples
