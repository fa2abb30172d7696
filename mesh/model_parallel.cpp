#include "zest/mesh/model_parallel.h"

namespace zest {

void refuse_model_parallel(const ModelParallel& mp, std::string_view what) {
  ZEST_CHECK(mp.size() == 1,
             "{} of a model split over tp {} x pp {} ranks is not supported yet: each tp rank holds slices "
             "under the whole parameters' names and each pipeline stage some of the units, which a "
             "weight file of the data-parallel group would mix up; checkpoints (save_checkpoint) keep a part "
             "per tp x pp rank, or export from a run with tp = pp = 1",
             what, mp.tp_size, mp.pp_size);
}

}  // namespace zest
