#----------------------------------------------------------------
# Generated CMake target import file for configuration "Release".
#----------------------------------------------------------------

# Commands may need to know the format version.
set(CMAKE_IMPORT_FILE_VERSION 1)

# Import target "fa3c::fa3c" for configuration "Release"
set_property(TARGET fa3c::fa3c APPEND PROPERTY IMPORTED_CONFIGURATIONS RELEASE)
set_target_properties(fa3c::fa3c PROPERTIES
  IMPORTED_LOCATION_RELEASE "${_IMPORT_PREFIX}/lib/libfa3c.so.0.7.0"
  IMPORTED_SONAME_RELEASE "libfa3c.so.0"
  )

list(APPEND _cmake_import_check_targets fa3c::fa3c )
list(APPEND _cmake_import_check_files_for_fa3c::fa3c "${_IMPORT_PREFIX}/lib/libfa3c.so.0.7.0" )

# Import target "fa3c::fa3c_static" for configuration "Release"
set_property(TARGET fa3c::fa3c_static APPEND PROPERTY IMPORTED_CONFIGURATIONS RELEASE)
set_target_properties(fa3c::fa3c_static PROPERTIES
  IMPORTED_LINK_INTERFACE_LANGUAGES_RELEASE "C"
  IMPORTED_LOCATION_RELEASE "${_IMPORT_PREFIX}/lib/libfa3c_static.a"
  )

list(APPEND _cmake_import_check_targets fa3c::fa3c_static )
list(APPEND _cmake_import_check_files_for_fa3c::fa3c_static "${_IMPORT_PREFIX}/lib/libfa3c_static.a" )

# Commands beyond this point should not need to know the version.
set(CMAKE_IMPORT_FILE_VERSION)
