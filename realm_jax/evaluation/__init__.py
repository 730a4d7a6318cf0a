"""Open-QA metrics and (later) prediction."""
