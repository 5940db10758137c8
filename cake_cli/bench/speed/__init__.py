"""`cake bench speed`: engine rows, the paths users run, ratios and report, targets."""
