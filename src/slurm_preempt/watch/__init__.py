"""The drain watcher: sees nodes going away (Slurm drains, provider events, cloud metadata) and tells the
jobs on them; restarts requeued jobs fast and moves often-preempted ones. Runs as root (cluster daemon)
or as the job's owner (sidecar)."""
