"""The record of what happened, read from the ledger afterwards: history, report, timeline. (The hooks
that write it are installed and checked by ``slurm_preempt.admin``.)"""
