"""The job side: what runs inside a Slurm job (resume, checkpoint store, notices, agreement across ranks,
requeue self). Import-light: standard library only on import, no side effects; torch loads only when
torch state is saved or loaded."""
