# The layering the build enforces: which directories' headers each layer may include.
#   base/      status, tensor types, quant block layouts and reference dequantizers, the MOELITE_*
#              options table (like ggml-base)
#   platforms/ the OS layer
#   backends/  backend.h is the interface (kv_layout.h: the KV cache's slot rule, column_copy.h:
#              copy_columns' bounds, and device_tier.h: how peers share a GPU's expert slots); each
#              backend includes only base/, platforms/, the interface and its own directory; the
#              registry alone sees every backend
#   core/      base/, platforms/ and the backend interface -- never a backend's internals. Inside
#              core, the folders are pipeline stages in this order (core/README.md), and a stage
#              includes only itself and the stages before it:
#                support gguf text model experts moe forward exec serve calibrate api
#   samples/   the public header (the CLI's trace tools also use the cache policies and trace
#              replay of core/experts/, and `moelite batch` reads its JSON-lines requests with
#              core/support/json.h: the CLI links the static archive, and one strict JSON reader is
#              better than two; `moelite chat --session` writes its conversation with
#              platforms/platform.h's write_file_atomic, the one rule for every file moelite writes)
# Runs at configure time (a violation stops the build) and as the ctest `layering`.
# Usage: cmake -DSOURCE_DIR=... -P check_layering.cmake   (or include() with SOURCE_DIR set)
cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...) in script mode
if(NOT SOURCE_DIR)
  set(SOURCE_DIR ${CMAKE_CURRENT_LIST_DIR}/..)
endif()
set(_rules
  "base/|base/"
  "platforms/|base/,platforms/"
  "backends/backend.h|base/"
  "backends/kv_layout.h|base/,backends/backend.h"
  "backends/column_copy.h|base/,backends/backend.h"
  "backends/device_tier.h|base/"
  "backends/cpu/|base/,platforms/,backends/backend.h,backends/kv_layout.h,backends/column_copy.h,backends/cpu/"
  "backends/vulkan/|base/,platforms/,backends/backend.h,backends/kv_layout.h,backends/column_copy.h,backends/device_tier.h,backends/vulkan/"
  "backends/cuda/|base/,platforms/,backends/backend.h,backends/kv_layout.h,backends/column_copy.h,backends/device_tier.h,backends/cuda/"
  "backends/backend_registry.cpp|base/,backends/"
  "samples/|samples/,core/experts/cache_policy.h,core/experts/trace_replay.h"
  "samples/cli/|samples/,core/experts/cache_policy.h,core/experts/trace_replay.h,core/support/json.h,platforms/platform.h")
# core/'s stages, lowest first: each may include base/, platforms/, the backend interface and the
# stages up to itself.
set(_core_stages support gguf text model experts moe forward exec serve calibrate api)
set(_below "base/,platforms/,backends/backend.h")
foreach(stage ${_core_stages})
  set(_below "${_below},core/${stage}/")
  list(APPEND _rules "core/${stage}/|${_below}")
endforeach()
set(_violations "")
file(GLOB_RECURSE _files RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/base/* ${SOURCE_DIR}/platforms/* ${SOURCE_DIR}/backends/*
     ${SOURCE_DIR}/core/* ${SOURCE_DIR}/samples/*)
foreach(f ${_files})
  if(NOT f MATCHES "\\.(c|cc|cpp|h|hpp|cu|cuh|inc)$")
    continue()
  endif()
  # core/'s sources live in its stage folders: not at its root, not in a folder outside the list.
  if(f MATCHES "^core/")
    string(REGEX REPLACE "^core/([^/]+)/.*" "\\1" _stage "${f}")
    if(_stage STREQUAL f OR NOT _stage IN_LIST _core_stages)
      string(REPLACE ";" " " _stage_names "${_core_stages}")
      list(APPEND _violations "${f} is outside core/'s stage folders (${_stage_names})")
      continue()
    endif()
  endif()
  set(_allowed "")
  set(_best 0)
  foreach(rule ${_rules})
    string(REPLACE "|" ";" parts "${rule}")
    string(REPLACE "," ";" parts "${parts}")
    list(GET parts 0 prefix)
    list(SUBLIST parts 1 -1 allowed)
    string(LENGTH "${prefix}" len)
    string(SUBSTRING "${f}" 0 ${len} head)
    if(head STREQUAL prefix AND len GREATER _best)
      set(_best ${len})
      set(_allowed "${allowed}")
    endif()
  endforeach()
  if(_best EQUAL 0)
    continue()
  endif()
  file(STRINGS ${SOURCE_DIR}/${f} includes REGEX "^[ \t]*#[ \t]*include[ \t]+\"")
  foreach(line ${includes})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([^\"]+)\".*" "\\1" inc "${line}")
    if(inc STREQUAL "moelite.h" OR NOT inc MATCHES "/")
      continue()  # the public header, or a file beside this one
    endif()
    set(ok FALSE)
    foreach(a ${_allowed})
      string(LENGTH "${a}" alen)
      string(SUBSTRING "${inc}" 0 ${alen} ihead)
      if(ihead STREQUAL a)
        set(ok TRUE)
      endif()
    endforeach()
    if(NOT ok)
      list(APPEND _violations "${f} includes \"${inc}\"")
    endif()
  endforeach()
endforeach()
if(_violations)
  string(REPLACE ";" "\n  " msg "${_violations}")
  message(FATAL_ERROR "layering violations:\n  ${msg}")
else()
  string(REPLACE ";" " < " _stage_order "${_core_stages}")
  message(STATUS "layering: base <- platforms <- backends <- core (${_stage_order}) respected")
endif()
