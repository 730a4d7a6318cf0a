"""The presets: the demo, reproduce, end_to_end and GPU stages (`demo`) and
the controlled world (`world_demo`), each run end to end by one command."""
