#!/bin/sh
# A chain, as with Slurm: pretrain, then evaluate only if pretraining succeeded (afterok). Run it where the
# rackscale CLI is (`sh examples/chain-afterok.sh`); --parsable prints the job id alone, and an option given on the
# command line (here --dependency) is added to the script's own.
set -eu
here=$(dirname "$0")
train=$(rackscale sbatch --parsable "$here/torchrun.sbatch")
evals=$(rackscale sbatch --parsable --dependency=afterok:"$train" "$here/evals-array.sbatch")
echo "pretraining $train, then evaluations $evals once it succeeded"
