# fa3c-run, the command-line runner (included from the top-level CMakeLists.txt).
# With the CUDA backend it also gets the CUDA runtime, to place inputs in
# device memory; otherwise tools/cli/device_mem.c compiles to a stub.
add_executable(fa3c-run tools/cli/fa3c_run.c tools/cli/row_check.c tools/cli/device_mem.c)
target_link_libraries(fa3c-run PRIVATE fa3c m)
target_compile_options(fa3c-run PRIVATE -Wall -Wextra)
if(FA3C_HAVE_CUDA)
  target_compile_definitions(fa3c-run PRIVATE FA3C_RUN_CUDA=1)
  target_link_libraries(fa3c-run PRIVATE CUDA::cudart_static)
endif()

# Smoke tests of the CLI and of the README's example (no GPU needed).
if(FA3C_BUILD_TESTS)
  add_test(NAME cli.help COMMAND fa3c-run --help)
  add_test(NAME cli.bad_flag COMMAND fa3c-run --no-such-flag)
  set_tests_properties(cli.bad_flag PROPERTIES WILL_FAIL TRUE)
  add_test(NAME cli.fwd_bf16_causal COMMAND fa3c-run --device cpu --batch 2 --seqlen 77 --seqlen-k 130
           --heads 6 --heads-kv 2 --hdim 64 --causal --dtype bf16 --iters 1 --check-rows 16)
  add_test(NAME cli.fwd_fp16_window_softcap COMMAND fa3c-run --device cpu --seqlen 100 --heads 2 --hdim 32
           --window 20,5 --softcap 15 --dtype fp16 --iters 1)
  add_test(NAME cli.fwd_e4m3 COMMAND fa3c-run --device cpu --seqlen 64 --heads 2 --hdim 128 --dtype e4m3 --iters 1)
  add_test(NAME cli.bwd_fp32 COMMAND fa3c-run --device cpu --backward --batch 2 --seqlen 48 --seqlen-k 80
           --heads 4 --heads-kv 2 --hdim 32 --causal --dtype fp32 --iters 1 --check-rows 12)
  add_test(NAME cli.bwd_bf16 COMMAND fa3c-run --device cpu --backward --seqlen 65 --heads 2 --hdim 64
           --dtype bf16 --iters 1 --check-rows 16)
  add_executable(example_hello examples/hello.c)
  target_link_libraries(example_hello PRIVATE fa3c m)
  add_test(NAME example.hello COMMAND example_hello)
endif()
