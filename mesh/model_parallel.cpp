#include "zest/mesh/model_parallel.h"

namespace zest {

void refuse_model_parallel(const ModelParallel& mp, std::string_view what) {
  ZEST_CHECK(mp.size() == 1,
             "{} of a model split over tp {} x pp {} ranks is not supported yet: each tp rank holds slices "
             "under the whole parameters' names and each pipeline stage some of the units, and a weight file "
             "of the whole model is not cut into them; import into a run with tp = pp = 1 (exports, "
             "export_weights and export_hf, do write the whole model from a mesh)",
             what, mp.tp_size, mp.pp_size);
}

}  // namespace zest
