"""The sbatch generator: checked options, the job spec, and the scripts rendered from templates/."""
