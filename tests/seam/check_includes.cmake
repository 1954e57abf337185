# The coordinator/worker seam, at the source level: no file under node/ reaches model code
# through its includes, directly or through any header it includes.
#   cmake -DSOURCE_DIR=<repo> -P check_includes.cmake
# Follows the project's own includes ("dir/file.h" under SOURCE_DIR) transitively from every
# source and header under node/, and fails naming the chain when one reaches worker/model/,
# worker/cuda/, worker/checkpoint/, worker/cpu/ or kernels/ (the model, its backends, its
# checkpoints and its kernels).
cmake_minimum_required(VERSION 3.25)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "pass -DSOURCE_DIR=<repository root>")
endif()
set(forbidden "^(worker/model/|worker/cuda/|worker/checkpoint/|worker/cpu/|kernels/)")

file(GLOB_RECURSE roots RELATIVE ${SOURCE_DIR} ${SOURCE_DIR}/node/*.h ${SOURCE_DIR}/node/*.cc)
if(NOT roots)
  message(FATAL_ERROR "no sources under ${SOURCE_DIR}/node")
endif()

# Breadth-first over the include graph; `via_<file>` records which file first included <file>.
set(queue ${roots})
set(seen ${roots})
set(violations "")
while(queue)
  list(POP_FRONT queue file)
  file(STRINGS ${SOURCE_DIR}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" inc "${line}")
    if(inc MATCHES "${forbidden}")
      # The chain back to a node/ file.
      set(chain "${inc} <- ${file}")
      set(at ${file})
      while(DEFINED via_${at})
        set(at ${via_${at}})
        string(APPEND chain " <- ${at}")
      endwhile()
      list(APPEND violations "${chain}")
      continue()
    endif()
    if(NOT EXISTS ${SOURCE_DIR}/${inc})
      continue()  # generated (proto) or a system header spelt with quotes
    endif()
    list(FIND seen ${inc} found)
    if(found EQUAL -1)
      list(APPEND seen ${inc})
      list(APPEND queue ${inc})
      set(via_${inc} ${file})
    endif()
  endforeach()
endwhile()

list(LENGTH roots n_roots)
list(LENGTH seen n_seen)
if(violations)
  list(JOIN violations "\n  " text)
  message(FATAL_ERROR "node/ reaches model code through its includes:\n  ${text}")
endif()
message(STATUS "seam: ${n_roots} files under node/, ${n_seen} project files reached, none of model code")
