"""The CAKE method as a library: torch and transformers only (no CLI imports)."""
