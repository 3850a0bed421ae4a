# ctest driver for programs_first_hour: runs diffusion_sample / flowedge-convert as a new user would and checks the
# text they print. -DDIFFUSION_SAMPLE=<exe> -DCONVERT=<exe> -DFIXTURES=<test/fixtures> -DWORK=<scratch dir>
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(dp "${FIXTURES}/dp_small")

# run(NAME EXPECT_RC ARGS...): runs a program, fails unless it exits EXPECT_RC; output in ${NAME}_out.
function(run name expect_rc)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc STREQUAL "${expect_rc}")
    message(FATAL_ERROR "${name}: exit ${rc}, expected ${expect_rc}\n${out}${err}")
  endif()
  set(${name}_out "${out}${err}" PARENT_SCOPE)
endfunction()

# need(NAME TEXT...): every TEXT must appear in ${NAME}_out.
function(need name)
  foreach(text ${ARGN})
    string(FIND "${${name}_out}" "${text}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${name}: expected the output to contain '${text}', got:\n${${name}_out}")
    endif()
  endforeach()
endfunction()

# The latency line names the weight dtype that ran: the file's when --dtype is not given.
run(convert 0 "${CONVERT}" "${dp}" "${WORK}/dp_small_bf16.flowedge.safetensors" --dtype bf16)
need(convert "BF16 weights")
run(bf16_file 0 "${DIFFUSION_SAMPLE}" "${WORK}/dp_small_bf16.flowedge.safetensors" 2 --repeats 1)
need(bf16_file "weights BF16)" "rows 1..8 (marked <) are executed:" "latency depends on the machine: ")
run(f32_folder 0 "${DIFFUSION_SAMPLE}" "${dp}" 2 --repeats 1)
need(f32_folder "weights F32)")
run(bf16_flag 0 "${DIFFUSION_SAMPLE}" "${dp}" 2 --repeats 1 --dtype BF16)
need(bf16_flag "weights BF16)")
run(f32_flag 0 "${DIFFUSION_SAMPLE}" "${WORK}/dp_small_bf16.flowedge.safetensors" 2 --repeats 1 --dtype f32)
need(f32_flag "weights F32)")

# --seed with DDIM is said to be ignored; choices are case-insensitive, as in Python.
run(seed_ddim 0 "${DIFFUSION_SAMPLE}" "${dp}" 2 --repeats 1 --seed 3)
need(seed_ddim "note: --seed is ignored with DDIM")
run(upper 0 "${DIFFUSION_SAMPLE}" "${dp}" 2 --repeats 1 --scheduler DDPM --seed 3 --device CPU --math F32)
need(upper "latency (cpu, ddpm 2 steps")
run(help 0 "${DIFFUSION_SAMPLE}" --help)
# --help shows the defaults (CLI11 prints them as "=10" or " [10]" depending on its version).
foreach(re "STEPS INT(=| \\[)10" "(=| \\[)ddim" "--seed UINT(=| \\[)0" "(=| \\[)file")
  if(NOT help_out MATCHES "${re}")
    message(FATAL_ERROR "help: expected the output to match '${re}', got:\n${help_out}")
  endif()
endforeach()

# Load errors say what the file is and what to do.
file(WRITE "${WORK}/notes.safetensors" "hello, this is a text file and not a model\n")
run(not_st 1 "${DIFFUSION_SAMPLE}" "${WORK}/notes.safetensors")
need(not_st "not a safetensors file")
file(SIZE "${WORK}/dp_small_bf16.flowedge.safetensors" full)
execute_process(COMMAND head -c 200000 "${WORK}/dp_small_bf16.flowedge.safetensors"
                OUTPUT_FILE "${WORK}/cut.flowedge.safetensors")
run(truncated 1 "${DIFFUSION_SAMPLE}" "${WORK}/cut.flowedge.safetensors")
need(truncated "file truncated: 200000 of ${full} bytes")
if(EXISTS "${FIXTURES}/mamba_flow/mamba_flow.safetensors")
  run(mamba_file 1 "${DIFFUSION_SAMPLE}" "${FIXTURES}/mamba_flow/mamba_flow.safetensors")
  need(mamba_file "this is a Mamba-flow checkpoint; use flow_sample")
  run(mamba_convert 1 "${CONVERT}" "${FIXTURES}/mamba_flow/mamba_flow.safetensors" "${WORK}/x.flowedge.safetensors")
  need(mamba_convert "this is a Mamba-flow checkpoint; use flow_sample")
endif()
if(EXISTS "${FIXTURES}/io/f64_2x3.npy")
  run(f64_cond 1 "${DIFFUSION_SAMPLE}" "${dp}" 2 --cond "${FIXTURES}/io/f64_2x3.npy")
  need(f64_cond "expected float32 .npy, got float64" "convert with arr.astype(np.float32)")
endif()
message(STATUS "programs_first_hour: all checks passed")
