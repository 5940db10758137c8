"""`cake bench quality`: the grid run, its results file and report, its plot."""
