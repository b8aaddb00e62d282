# CUDA sources of libfa3c. FA3C_INSTANCES picks the kernel instances built
# ("all", or e.g. "bf16_hdim128" for a one-instance build in under a minute;
# "all" leaves the *_varlen ones out with FA3C_CUDA_VARLEN=OFF).
# Each forward instance bf16/fp16_hdim64/128/192/256 brings the backward instance of
# the same name (inst/bwd_*.cu; bwd_tiles.h has its head dims), and
# bf16_hdim128/256 the e4m3 forward of the head dim (inst/fwd_e4m3_*.cu).
# (tools/gen_instances.py writes the files)
set(FA3C_ALL_INSTANCES bf16_hdim64 bf16_hdim96 bf16_hdim128 bf16_hdim192 bf16_hdim256 bf16_hdim256_n64
                       fp16_hdim64 fp16_hdim96 fp16_hdim128 fp16_hdim192 fp16_hdim256 fp16_hdim256_n64
                       bf16_hdim64_varlen bf16_hdim96_varlen bf16_hdim128_varlen bf16_hdim192_varlen
                       bf16_hdim256_varlen fp16_hdim64_varlen fp16_hdim96_varlen fp16_hdim128_varlen
                       fp16_hdim192_varlen fp16_hdim256_varlen)
if(FA3C_INSTANCES STREQUAL "all")
  set(_fa3c_selected ${FA3C_ALL_INSTANCES})
  if(NOT FA3C_CUDA_VARLEN)   # FA3C_CUDA_VARLEN=OFF: "all" without the *_varlen instances
    list(FILTER _fa3c_selected EXCLUDE REGEX "_varlen$")
  endif()
else()
  set(_fa3c_selected ${FA3C_INSTANCES})
endif()
set(FA3C_CUDA_SOURCES ${PROJECT_SOURCE_DIR}/src/cuda/backend.c ${PROJECT_SOURCE_DIR}/src/cuda/tensor_map.c
                      ${PROJECT_SOURCE_DIR}/src/cuda/fwd_plan.c ${PROJECT_SOURCE_DIR}/src/cuda/fwd_combine.cu
                      ${PROJECT_SOURCE_DIR}/src/cuda/bwd_host.c ${PROJECT_SOURCE_DIR}/src/cuda/bwd_prep.cu
                      ${PROJECT_SOURCE_DIR}/src/cuda/fp8_host.c ${PROJECT_SOURCE_DIR}/src/cuda/fp8_prep.cu)
set(FA3C_BWD_INSTANCES bf16_hdim64 bf16_hdim128 bf16_hdim192 bf16_hdim256 fp16_hdim64 fp16_hdim128 fp16_hdim192
                       fp16_hdim256)
set(_fa3c_bwd_defs "")
set(_fa3c_fp8_defs "")
set(_fa3c_defs "")
foreach(inst ${_fa3c_selected})
  if(NOT inst IN_LIST FA3C_ALL_INSTANCES)
    message(FATAL_ERROR "FA3C_INSTANCES: unknown instance '${inst}' (known: ${FA3C_ALL_INSTANCES})")
  endif()
  list(APPEND FA3C_CUDA_SOURCES ${PROJECT_SOURCE_DIR}/src/cuda/inst/fwd_${inst}.cu)
  list(APPEND _fa3c_defs FA3C_INST_${inst}=1)
  if(inst MATCHES "^bf16_hdim(128|256)$")   # the e4m3 instance of the head dim (fwd_fp8_sm90.cuh)
    string(REPLACE "bf16_" "e4m3_" fp8_inst ${inst})
    list(APPEND FA3C_CUDA_SOURCES ${PROJECT_SOURCE_DIR}/src/cuda/inst/fwd_${fp8_inst}.cu)
    list(APPEND _fa3c_fp8_defs FA3C_FP8_INST_${fp8_inst}=1)
  endif()
  if(inst IN_LIST FA3C_BWD_INSTANCES)
    list(APPEND FA3C_CUDA_SOURCES ${PROJECT_SOURCE_DIR}/src/cuda/inst/bwd_${inst}.cu)
    list(APPEND _fa3c_bwd_defs FA3C_BWD_INST_${inst}=1)
  endif()
endforeach()
if(FA3C_CUDA_BWD)   # the backward kernels are built either way; this lets bwd_host.c use them
  list(APPEND _fa3c_bwd_defs FA3C_CUDA_BWD=1)
endif()
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/cuda/bwd_host.c PROPERTIES COMPILE_DEFINITIONS "${_fa3c_bwd_defs}")
if(FA3C_CUDA_FP8)   # the e4m3 kernels are built either way; this lets fp8_host.c use them
  list(APPEND _fa3c_fp8_defs FA3C_CUDA_FP8=1)
endif()
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/cuda/fp8_host.c PROPERTIES COMPILE_DEFINITIONS "${_fa3c_fp8_defs}")
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/cuda/backend.c PROPERTIES COMPILE_DEFINITIONS "${_fa3c_defs}")
