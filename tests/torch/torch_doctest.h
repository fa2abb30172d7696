// doctest after libtorch: Debian's libtorch logs through glog, whose CHECK
// macros would otherwise replace doctest's. Include this instead of
// <doctest/doctest.h>, after the torch headers.
#pragma once

#include <torch/torch.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>
