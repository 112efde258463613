# The library's layers, enforced by the build. Each layer is an OBJECT library that compiles against its own include
# root in the build tree (build/layers/<layer>/), made of symbolic links to the source folders of the layer and of
# the layers below it, and to the public headers (include/mambacpp/) those layers own. A source that includes a
# header of a higher layer, or a public header its layers do not own, fails to compile: "No such file".
#
#   mambacpp_layer(<name> DIRS <src folders> [HEADERS <public headers>] [BELOW <layers>] SOURCES <files>)
#
# DIRS and HEADERS are what the layer owns; BELOW names the layers it builds on (their folders and headers are
# visible, transitively). The objects of every layer go into the one `mambacpp` library.

set(MAMBACPP_LAYER_ROOTS ${CMAKE_CURRENT_BINARY_DIR}/layers)

function(mambacpp_layer name)
  cmake_parse_arguments(L "" "" "DIRS;HEADERS;BELOW;SOURCES" ${ARGN})
  set(dirs ${L_DIRS})
  set(headers ${L_HEADERS})
  foreach(below IN LISTS L_BELOW)
    get_property(below_dirs GLOBAL PROPERTY MAMBACPP_LAYER_${below}_DIRS)
    get_property(below_headers GLOBAL PROPERTY MAMBACPP_LAYER_${below}_HEADERS)
    if(NOT below_dirs)
      message(FATAL_ERROR "mambacpp_layer(${name}): layer '${below}' below it is not defined (yet)")
    endif()
    list(APPEND dirs ${below_dirs})
    list(APPEND headers ${below_headers})
  endforeach()
  list(REMOVE_DUPLICATES dirs)
  list(REMOVE_DUPLICATES headers)
  set_property(GLOBAL PROPERTY MAMBACPP_LAYER_${name}_DIRS ${dirs})
  set_property(GLOBAL PROPERTY MAMBACPP_LAYER_${name}_HEADERS ${headers})

  set(root ${MAMBACPP_LAYER_ROOTS}/${name})
  file(REMOVE_RECURSE ${root})  # removes the links only, never what they point to
  file(MAKE_DIRECTORY ${root}/mambacpp)
  foreach(dir IN LISTS dirs)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${dir} ${root}/${dir} SYMBOLIC)
  endforeach()
  foreach(header IN LISTS headers)
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/include/mambacpp/${header})
      message(FATAL_ERROR "mambacpp_layer(${name}): no public header include/mambacpp/${header}")
    endif()
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/mambacpp/${header} ${root}/mambacpp/${header} SYMBOLIC)
  endforeach()

  add_library(mambacpp_${name} OBJECT ${L_SOURCES})
  target_include_directories(mambacpp_${name} PRIVATE ${root})
  target_link_libraries(mambacpp_${name} PRIVATE mambacpp_build_settings)
endfunction()
