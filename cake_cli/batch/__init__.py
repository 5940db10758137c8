"""`cake batch`: rows, executors (driver, processes, Ray actors), the JSON-lines output (above tasks)."""
