"""Benchmarks: speed and memory (`speed.py`), quality (`quality.py`)."""
