# The layer order of the source tree, written once (docs/ARCHITECTURE.md draws it), and the
# check that every #include "dir/..." in a layer's C++/CUDA files points at the same layer or
# a lower one. Lowest first:
#   core       tensor, dtype, errors, RNG, the Backend and Attention interfaces and configs
#   layers     CPU kernels of the layers (matmul, layernorm, GELU, encoder, loss)
#   attention  CPU attention: baseline, flash, stabilized flash, the head lab, experiments
#   optim      AdamW kernel, LR schedule, loss scaler
#   backends   the CPU backend (assembles the three above) and make_backend
#   cuda       the CUDA backend and its kernels (implements backends/backends.h's factory)
#   model      GPT-2 forward/backward on a Backend
#   data       tokenizers, token shards, datasets, the loader
#   dist       communicators (single, MPI, NCCL) and rendezvous
#   io         file formats: checkpoints, llm.c and safetensors weights
#   analysis   weight slices, spectral/Wasserstein statistics shared by hooks and tools
#   train      config, trainer, stability hooks, run directory I/O
#   apps       the programs a user runs (train, study, report, compare, bench, ...)
# tests/ may include anything. Includes whose first component is not a layer (system
# headers, "simt/simt.h": the SIMT emulator's runtime, cuda/ under tests/simt) are not
# checked.
#
# Used two ways:
#   include()d by CMakeLists.txt: st_check_layers(<root> <out-var>) at configure time, which
#     stops the configuration on a violation;
#   as a script (the cpu-labelled test LayerOrder.IncludesPointDown):
#     cmake -DROOT=<source dir> -P tools/check_layers.cmake
#   prints every violation as "file: <layer> includes <header> from the higher layer <layer>"
#   and exits non-zero.
set(ST_LAYERS core layers attention optim backends cuda model data dist io analysis train apps)

function(st_check_layers root out_var)
  set(violations "")
  set(checked 0)
  foreach(layer IN LISTS ST_LAYERS)
    list(FIND ST_LAYERS ${layer} rank)
    file(GLOB_RECURSE files RELATIVE ${root}
         ${root}/${layer}/*.h ${root}/${layer}/*.cpp ${root}/${layer}/*.cu ${root}/${layer}/*.cuh)
    foreach(f IN LISTS files)
      math(EXPR checked "${checked} + 1")
      # Only the #include lines: CMake lists would split other lines at ';' and merge them
      # across '[' ... ']'.
      file(STRINGS ${root}/${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"/]+/")
      foreach(line IN LISTS lines)
        if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^/\"]+)/([^\"]*)\"")
          set(dir ${CMAKE_MATCH_1})
          list(FIND ST_LAYERS ${dir} inc_rank)
          if(inc_rank GREATER rank)
            list(APPEND violations
                 "${f}: ${layer} includes ${dir}/${CMAKE_MATCH_2} from the higher layer ${dir}")
          endif()
        endif()
      endforeach()
    endforeach()
  endforeach()
  if(checked EQUAL 0)
    list(APPEND violations "${root}: no source files found under the layer directories")
  endif()
  set(${out_var} "${violations}" PARENT_SCOPE)
  set(${out_var}_FILES ${checked} PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE)
  if(NOT DEFINED ROOT)
    message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P tools/check_layers.cmake")
  endif()
  # A relative ROOT (-DROOT=.) is taken from the working directory: file(GLOB) needs it whole.
  get_filename_component(ROOT "${ROOT}" ABSOLUTE BASE_DIR "$ENV{PWD}")
  st_check_layers(${ROOT} v)
  if(v)
    list(LENGTH v count)
    foreach(line IN LISTS v)
      message(NOTICE "${line}")  # unwrapped, one line each
    endforeach()
    message(FATAL_ERROR "${count} include(s) point up the layer order "
                        "(tools/check_layers.cmake, docs/ARCHITECTURE.md): move the code to "
                        "the lower layer or the declaration it needs down")
  endif()
  message(STATUS "layer order: ${v_FILES} files checked, every include points down")
endif()
