"""cake-cli: long-document tasks under a fixed KV-cache budget with CAKE (ICLR 2025)."""

__version__ = "0.1.0"
