"""Benchmark suites (``attnkit bench <suite>``): side-by-side timings, medians, ratios, JSON results."""
