"""Inputs of a task: documents (text, PDF, stdin), normalised."""
