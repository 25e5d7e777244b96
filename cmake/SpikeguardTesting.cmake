# spikeguard_test(NAME name SOURCES a.cc ... [LIBS lib ...] [LABELS l ...] [TIMEOUT s])
# One GoogleTest binary; each TEST becomes its own ctest entry, with the
# TIMEOUT (default 300 s) and every one of the LABELS.
include(GoogleTest)
function(spikeguard_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gmock GTest::gtest_main
    spikeguard_warnings)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  # gtest_discover_tests flattens its PROPERTIES into one list on the way to
  # the generated set_tests_properties (CMake 3.25), so a list value cannot
  # pass: "LABELS a;b TIMEOUT 60" came out as LABELS=a, b=TIMEOUT and no
  # timeout. Only single values go through it; several labels are set by a
  # ctest include file that runs after the discovery's and names the tests
  # it listed (${NAME}_TESTS).
  list(LENGTH ARG_LABELS n_labels)
  set(properties TIMEOUT ${ARG_TIMEOUT})
  if(n_labels EQUAL 1)
    list(APPEND properties LABELS ${ARG_LABELS})
  endif()
  gtest_discover_tests(${ARG_NAME}
    DISCOVERY_MODE PRE_TEST
    TEST_LIST ${ARG_NAME}_TESTS
    PROPERTIES ${properties}
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  if(n_labels GREATER 1)
    set(labels_file "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_labels.cmake")
    file(WRITE "${labels_file}"
      "if(NOT \"\${${ARG_NAME}_TESTS}\" STREQUAL \"\")\n"
      "  set_tests_properties(\${${ARG_NAME}_TESTS} PROPERTIES LABELS \"${ARG_LABELS}\")\n"
      "endif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${labels_file}")
  endif()
endfunction()
