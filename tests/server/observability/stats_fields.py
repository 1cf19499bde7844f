"""The statistics fields tests check: all of them, and those perf_analyzer reads unchecked."""

DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
# What perf_analyzer reads with GetUint64 and no existence check (triton-facts §0 item 6).
PERF_ANALYZER_DURATIONS = tuple(name for name in DURATIONS if name != "fail")
