"""Test helpers: tiny models, the masking reference and oracles, real texts, embedded-model marks."""
