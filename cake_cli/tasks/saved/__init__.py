"""Saved compressed prefixes: the .cake format, the store, compress once / answer many."""
