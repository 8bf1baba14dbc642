"""Rollout- against sample-level handling, trained side by side: the ablation, one module an experiment.

- `python -m bench.ablation` (bench/ablation/__main__.py): the command line; `--harness` picks
  the experiment, `--pilot` the untrained pilot, `--report` a report on the recorded runs alone.
- bench/ablation/splitting.py: three arms on the splitting agent, whose splits follow its
  calculator calls.
- bench/ablation/compacting.py: two arms on the compacting agent, whose splits follow failure,
  with the statistics to tell them apart (bench/ablation/stats.py).
- bench/ablation/pilot.py: the untrained model's rollouts on a harness, samples against reward.
- bench/ablation/training.py: the agents, the arms, and each (arm, seed) trained from scratch
  through examples/demo.py, seed by seed with the arms interleaved.
- bench/ablation/record.py: `Run`, the one results record of a finished run, and the one way it
  is written and read (a JSON file per run).
"""
