"""``slurm-preempt simulate``: what one job would cost and how long it would take under preemption.

A seeded Monte Carlo simulator of one job description against several strategies (on-demand only, the
seeds' plain recipe, submitit-style, this toolkit with each fallback policy). ``spec`` holds the job
and the field (validated input), ``trace`` reads preemption times from a file, ``strategies`` the
strategies and their fallback decisions, ``engine`` runs them (vectorised over runs with numpy, the
optional ``simulate`` extra), ``results`` sums them up as a table or JSON, ``svg`` draws cost against
preemption rate. Nothing here talks to Slurm.
"""
