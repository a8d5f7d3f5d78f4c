"""Rehearsing preemption: a real multi-node Slurm on one host (testcluster), and drills that drain and
remove nodes the way a provider does."""
