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
distance      how far a sampled law is from its target: TV estimates, intervals, certificates
"""

import importlib

# name -> submodule: loaded on first use (PEP 562), so that a tool that needs Holm and a chi-square tail
# (specsample audit) does not import scipy.stats (0.4 s) through the modules that do
_WHERE = {
    **dict.fromkeys(("acceptance_probability", "accepted_drafts_law", "accepted_drafts_test", "bernoulli_sum_test",
                     "expected_tokens_per_round", "optimal_draft_length", "per_token_acceptance",
                     "per_token_acceptance_test", "walltime_improvement"), "acceptance"),
    "transition_test": "context",
    **dict.fromkeys(("goodness_of_fit", "kl_divergence", "pool_cells", "support_check", "total_variation"), "gof"),
    **dict.fromkeys(("benjamini_hochberg", "holm", "rejection_rate", "uniformity_test"), "multiplicity"),
    **dict.fromkeys(("chisquare_power", "min_detectable_tv", "noncentrality", "required_noncentrality",
                     "samples_for_tv"), "power"),
    **dict.fromkeys(("homogeneity_test", "independence_test"), "twosample"),
}
_MODULES = ("acceptance", "anytime", "context", "distance", "gof", "identity", "multiplicity", "power", "twosample")

__all__ = ["anytime", "distance", "identity", *_WHERE]


def __getattr__(name):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'stats' has no attribute {name!r}")
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE) | set(_MODULES))
