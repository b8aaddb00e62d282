// One kernel instance per translation unit (see src/cuda/instances.h).
#include "../fwd_launch.cuh"
FA3C_FWD_INSTANCE(fa3c_fwd_sm90_bf16_hdim96, 96, 0)
