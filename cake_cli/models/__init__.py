"""Models: loading (profile, directory, GGUF, HF cache), GGUF conversion, profiles."""
