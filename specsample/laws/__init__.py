"""Exact laws: what a scheme's output must be, computed without sampling (float64 enumeration).

- :mod:`.rounds`: the round-law type and the enumeration steps both law modules share;
- :mod:`.exact`: round laws of the chain schemes and controls, stream joints, laws of neural pairs
  from their teacher-forced rows;
- :mod:`.tree_exact`: round laws of the token-tree rules;
- :mod:`.reference`: plain numpy (and torch) implementations of the standard rule, the benchmark's
  baseline and an independent reference.
"""
