"""Tools around training: the plan benchmark and its report, seed sweeps and hyper-parameter search."""
