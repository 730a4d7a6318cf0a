"""Held-out masked LM, Open-QA scoring, predictions and bootstrap intervals."""
