# SPDX-License-Identifier: MIT
# kv_build_info.cmake — run at every build (cmake -P) to write the header the
# kvpage command prints in `kvpage --version`: the commit the source tree is
# at (git describe --tags --always --dirty) and the features built in. OUT is
# rewritten only when its text changes, so an unchanged tree rebuilds nothing.
# The commit is "unknown" outside git, and also when SRC is not the top of
# its own git work tree (a copy vendored inside another project's repository
# would otherwise report that project's commit).
# Inputs (-D): SRC (source root), OUT (header path), FEATURES (text).
set(commit unknown)
find_program(KV_GIT git)
if(KV_GIT)
  execute_process(COMMAND ${KV_GIT} -C ${SRC} rev-parse --show-toplevel
    OUTPUT_VARIABLE top RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0)
    get_filename_component(top "${top}" REALPATH)
    get_filename_component(src "${SRC}" REALPATH)
    if(top STREQUAL src)
      execute_process(COMMAND ${KV_GIT} -C ${SRC} describe --tags --always --dirty
        OUTPUT_VARIABLE desc RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(rc EQUAL 0 AND desc)
        set(commit "${desc}")
      endif()
    endif()
  endif()
endif()
file(WRITE "${OUT}.tmp"
  "/* Generated at build time by cmake/kv_build_info.cmake: do not edit. */\n"
  "#define KV_BUILD_COMMIT \"${commit}\"\n"
  "#define KV_BUILD_FEATURES \"${FEATURES}\"\n")
configure_file("${OUT}.tmp" "${OUT}" COPYONLY)
file(REMOVE "${OUT}.tmp")
