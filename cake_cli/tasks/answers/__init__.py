"""Post-processing of generated answers: code-only completions, located quotes."""
