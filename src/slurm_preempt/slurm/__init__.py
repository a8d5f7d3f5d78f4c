"""Slurm itself: the one place that runs its commands (``commands``) and the pure parsers of what they
print (``parse``). Nothing else in slurm-preempt starts a Slurm process."""
