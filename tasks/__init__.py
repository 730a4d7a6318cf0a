"""seqio task and mixture registrations for realm-jax.

Importing this package registers the tasks (pre-training, ICT, Open-QA); they
arrive with the data pipeline.
"""
