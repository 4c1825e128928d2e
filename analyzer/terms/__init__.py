"""The words and numbers every analyzer room shares: the report's vocabulary (verdicts,
statuses, config field names) and the numerical tolerances of every proof. Imports nothing."""
