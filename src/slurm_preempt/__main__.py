from slurm_preempt.cli import main

main()
