"""Analysis: P99 jump detection, attribution and the regression gate (numpy/scipy)."""
