# Writes OUT, a header defining MXTRAIN_GIT_COMMIT: the source tree's git HEAD (with "-dirty"
# for uncommitted changes to tracked files), or "" outside a git checkout (a source archive).
# Run at every build, and the file is rewritten only when it changes: `mxtrain --version`
# names the commit it was built from, not the one CMake was first configured at.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  set(commit "")
else()
  execute_process(COMMAND git -C "${SRC}" status --porcelain --untracked-files=no
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT changes STREQUAL "")
    string(APPEND commit "-dirty")
  endif()
endif()
file(CONFIGURE OUTPUT "${OUT}" CONTENT "#define MXTRAIN_GIT_COMMIT \"${commit}\"\n")
