"""What an admin installs and checks on a cluster: the prolog/epilog hooks that write the restart ledger
(``hooks``) and what the running Slurm does to requeued jobs (``requeuecheck``). ``slurm-preempt hooks``
(cli/hooks.py) is their command line."""
