# The Python used by interop tests: needs numpy and safetensors==0.8.0.
#
# SAFETENSORS_PYTHON names it; otherwise the repository's .venv (made by tests/run), else
# python3 from PATH. Without the packages the fixture tests report "skipped" with the reason,
# or fail when the environment variable SAFETENSORS_REQUIRE_PYTHON=1 (as in CI).
set(SAFETENSORS_PYTHON "" CACHE FILEPATH "Python with numpy and safetensors==0.8.0, for interop tests")

if(SAFETENSORS_PYTHON)
  set(SAFETENSORS_PYTHON_FOR_TESTS "${SAFETENSORS_PYTHON}")
elseif(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  set(SAFETENSORS_PYTHON_FOR_TESTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
else()
  find_program(_st_python3 python3)
  set(SAFETENSORS_PYTHON_FOR_TESTS "${_st_python3}")
endif()

set(SAFETENSORS_PYTHON_OK OFF)
if(SAFETENSORS_PYTHON_FOR_TESTS)
  execute_process(
    COMMAND "${SAFETENSORS_PYTHON_FOR_TESTS}" -c
            "import numpy, safetensors; assert safetensors.__version__ == '0.8.0', safetensors.__version__"
    RESULT_VARIABLE _st_rc OUTPUT_QUIET ERROR_QUIET)
  if(_st_rc EQUAL 0)
    set(SAFETENSORS_PYTHON_OK ON)
  endif()
endif()
if(SAFETENSORS_PYTHON_OK)
  message(STATUS "safetensors: interop tests use ${SAFETENSORS_PYTHON_FOR_TESTS}")
else()
  message(STATUS "safetensors: no Python with numpy and safetensors==0.8.0 (tried '${SAFETENSORS_PYTHON_FOR_TESTS}'); "
                 "interop tests will be skipped")
endif()

# safetensors_python_fixture(NAME <test> FIXTURE <fixture> ARGS <interop.py args>... [NEEDS_NETWORK])
# A ctest fixture that runs tests/python/interop.py. Exit code 77 means skipped (no Python),
# 3 means skipped (no network, for NEEDS_NETWORK fixtures).
function(safetensors_python_fixture)
  cmake_parse_arguments(ARG "NEEDS_NETWORK" "NAME;FIXTURE" "ARGS" ${ARGN})
  if(SAFETENSORS_PYTHON_OK)
    add_test(NAME ${ARG_NAME} COMMAND "${SAFETENSORS_PYTHON_FOR_TESTS}" "${PROJECT_SOURCE_DIR}/tests/python/interop.py"
                                      ${ARG_ARGS})
  else()
    set(_why "skipped: no Python with numpy and safetensors==0.8.0 (set SAFETENSORS_PYTHON or run tests/run)")
    add_test(NAME ${ARG_NAME}
             COMMAND sh -c "echo '${_why}'; if [ \"$SAFETENSORS_REQUIRE_PYTHON\" = 1 ]; then exit 1; fi; exit 77")
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES FIXTURES_SETUP ${ARG_FIXTURE} SKIP_RETURN_CODE 77 LABELS fixture)
  if(ARG_NEEDS_NETWORK AND SAFETENSORS_PYTHON_OK)
    set_tests_properties(${ARG_NAME} PROPERTIES SKIP_RETURN_CODE 3)
  endif()
endfunction()
