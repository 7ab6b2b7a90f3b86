"""Framework-agnostic statistics for verifying samplers from their counts.

numpy and scipy only: counts from a JAX, torch or C++ sampler can be tested directly.

Modules
-------
gof           goodness of fit to a known distribution (pooled chi-square / G, Monte
              Carlo p-values, support check, KL with bias, TV with a bound)
context       per-context transition tests for n-gram (Markov) models
twosample     homogeneity of two samplers' counts; independence of paired outcomes
acceptance    acceptance theory of standard speculative sampling
multiplicity  Holm, Benjamini-Hochberg, uniformity of p-values, rejection rates
power         noncentral chi-square power, sample sizes, minimum detectable TV
anytime       e-processes: tests whose false-alarm bound holds however often one looks
identity      identity tests whose power claims hold for the token law at any vocabulary size
"""

from . import anytime, identity
from .acceptance import (
    acceptance_probability,
    accepted_drafts_law,
    accepted_drafts_test,
    bernoulli_sum_test,
    expected_tokens_per_round,
    optimal_draft_length,
    per_token_acceptance,
    per_token_acceptance_test,
    walltime_improvement,
)
from .context import transition_test
from .gof import (
    goodness_of_fit,
    kl_divergence,
    pool_cells,
    support_check,
    total_variation,
)
from .multiplicity import benjamini_hochberg, holm, rejection_rate, uniformity_test
from .power import (
    chisquare_power,
    min_detectable_tv,
    noncentrality,
    required_noncentrality,
    samples_for_tv,
)
from .twosample import homogeneity_test, independence_test

__all__ = [
    "anytime", "identity",
    "acceptance_probability", "accepted_drafts_law", "accepted_drafts_test", "bernoulli_sum_test",
    "expected_tokens_per_round", "optimal_draft_length", "per_token_acceptance",
    "per_token_acceptance_test", "walltime_improvement", "transition_test",
    "goodness_of_fit", "kl_divergence", "pool_cells", "support_check", "total_variation",
    "benjamini_hochberg", "holm", "rejection_rate", "uniformity_test", "chisquare_power",
    "min_detectable_tv", "noncentrality", "required_noncentrality", "samples_for_tv",
    "homogeneity_test", "independence_test",
]
