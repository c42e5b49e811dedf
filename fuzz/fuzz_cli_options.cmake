# fuzz_cli_options: the pkv tool's option parsers (tools/options.c, and common.c that they call).
set(pkv_fuzz_extra_sources ${PROJECT_SOURCE_DIR}/tools/options.c ${PROJECT_SOURCE_DIR}/tools/common.c)
set(pkv_fuzz_extra_includes ${PROJECT_SOURCE_DIR}/tools)
