"""Imports Google's released REALM checkpoints without TensorFlow or torch."""
