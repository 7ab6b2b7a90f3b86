"""The battery's plan: budgets, cases, which tests each case runs and how many samples it gets.

A :class:`Case` is one pair of models (or a sweep of pairs) with one draft length k and window
L; :func:`default_cases` lists the battery for a budget and :func:`select` narrows it by name.
The planning functions count each case's tests before any sampling (Holm's most stringent level
``alpha / m`` sizes every case) and turn a budget's target TV into sequences by the power
calculation (:mod:`stats.power`), capped by the budget.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import zlib
from typing import NamedTuple, Optional

import stats

from . import diagnosis, stages
from .tree_round_law import cached_tree_rule
from .tree_stages import TREE_STAGES, tree_rule
from ..models.tables import lift
from ..models.pairs import FAMILIES, NEURAL_FAMILIES, Pair, make_pair, make_pairs, neural_pair, ngram_pair
from ..schemes import Scheme, StatefulStep

DRAFT_LENGTHS = (1, 4, 8)
LARGE_VOCAB = diagnosis.TOKEN_TEST_VOCAB  # 4096: above it, each position and stage law gets the token chi-square


class Budget(NamedTuple):
    """How much sampling a run may spend.

    ``tv`` is the target minimum detectable total variation; ``max_sequences`` caps each
    case (a pair), ``sweep_pairs`` and ``sweep_sequences`` size the random-pair sweep.
    """

    name: str
    tv: float
    max_sequences: int
    large_vocab_sequences: int
    sweep_pairs: int
    sweep_sequences: int
    lanes: int
    per_lane: int
    neural_sequences: int = 1 << 16  # cap per transformer case (a neural round costs ~1000x a table lookup)


# The serving-vocabulary cases (family, V, the most sequences the engine's own draws allow). The engine's
# float32 uniforms take 2^23 values, so it realises a law of V tokens only to about V 2^-25 in TV
# (models.tables.draw_resolution_tv bounds it); each cap keeps that floor's shift of the token chi-square
# (stats.identity.token_chi2_test) at position 0 below a quarter of its null standard deviation, computed
# from the law the engine's tables realise (tests/test_serving_vocab.py). A tokenizer-like tail (most tokens
# below 2^-23) meets the floor soonest. Each case runs min(its cap, the budget's large_vocab_sequences).
SERVING_CASES = (("large-vocab", 32768, 1 << 22), ("large-vocab-zipf", 32768, 1 << 19),
                 ("large-vocab", 131072, 1 << 22))
SERVING_CLAIM_SEQUENCES = 1 << 16  # fewer leave nearly every token of these in the token chi-square's rest cell
BUDGETS = {
    "quick": Budget("quick", 0.02, 1 << 15, 1 << 12, 32, 1 << 12, 256, 8, 1 << 13),
    "default": Budget("default", 1e-3, 1 << 21, 1 << 22, 256, 1 << 14, 4096, 64, 1 << 16),
    "thorough": Budget("thorough", 3e-4, 1 << 25, 1 << 22, 1024, 1 << 16, 4096, 64, 1 << 19),
    # specsample measure's default: twice the default's cap, which the certificate's power calculation
    # (stats.distance.sequences_to_certify) asks for to certify every table case's position laws within the
    # min detectable TV that `verify` at the default budget states (0.8-0.98 x 2^21 at power 0.8 each)
    "certify": Budget("certify", 1e-3, 1 << 22, 1 << 22, 256, 1 << 14, 4096, 64, 1 << 16),
}


# --- the cases -------------------------------------------------------------------------

NGRAM_FAMILIES = {
    # name: (order, concentration, mix of q with an independent table)
    "ngram-1": (1, 1.0, 0.5),
    "ngram-1-near": (1, 1.0, 0.05),
    "ngram-1-identical": (1, 1.0, 0.0),
    "ngram-1-peaked": (1, 0.2, 0.5),
    "ngram-2": (2, 1.0, 0.5),
    "ngram-2-peaked": (2, 0.3, 0.5),
}
NGRAM_ORDER = max(o for o, _, _ in NGRAM_FAMILIES.values())  # all run as tables of this order
BOUNDARY_FAMILY = "zeros-in-p"  # q puts mass where p has none: what a `u <= p / q` rule lets through
# transformer cases: (family, vocab, prompt tokens, longest L: V**L cells stay countable whole, and
# the exact law enumerates V**(L-1) prefixes), for which draft lengths. L = k + 2 up to the longest;
# the V = 2 cases keep L = 2k + 3 tokens, so that at least three rounds follow a round that accepted
# every draft (a cache bug that shows only after a full acceptance needs that), tested prefix by prefix
NEURAL_CASES = (
    ("transformer-close", 8, 3, 5, (1, 4, 8)),
    ("transformer-far", 8, 1, 5, (1, 4, 8)),
    ("transformer-close", 32, 2, 3, (4,)),
    ("transformer-far", 32, 1, 3, (1,)),
    ("transformer-close", 2, 3, 19, (1, 4, 8)),
)
LONG_WINDOW_VOCAB = 2  # the transformer cases whose windows span rounds (L = 2k + 3)
LONG_WINDOW_SEQUENCES = 1 << 15  # their cap per case at any budget (the cached battery's time)
# (lanes, per_lane) of a transformer case. A lane carries two KV caches, and every round rewrites
# them: 64 lanes keep that in a CPU's cache (k = 4, 8: 1.2-1.5x the rounds/s of 256 lanes; k = 1: 0.9x)
NEURAL_BLOCK = (64, 16)


@dataclasses.dataclass(frozen=True)
class Case:
    """A planned case. Cases sharing ``group`` run in one batched engine call."""

    name: str
    family: str
    vocab: int
    k: int
    length: int
    order: int = 0
    sweep: int = 0  # > 0: a sweep over this many random pairs of ``family``
    model_order: Optional[int] = None  # the model's own order when run lifted to ``order``
    boundary: bool = False  # the boundary pass (extreme uniforms, hard checks) instead of sampling
    prompt_len: int = 0  # transformer cases: tokens every sequence starts after

    @property
    def neural(self) -> bool:
        return self.family in NEURAL_FAMILIES

    @property
    def spans_rounds(self) -> bool:
        """A transformer case whose window holds rounds after a full acceptance (prefix tests, joint counted)."""
        return self.neural and self.vocab == LONG_WINDOW_VOCAB

    @property
    def group(self):
        return (self.vocab, self.order, self.k, self.length, self.sweep, self.prompt_len)

    @property
    def model(self) -> str:
        if self.boundary:
            return "boundary"
        if self.neural:
            return f"transformer, prompt {self.prompt_len}"
        if self.sweep:
            return f"sweep x{self.sweep}"
        order = self.order if self.model_order is None else self.model_order
        return "context-free" if order == 0 else f"{order}-gram"

    def pair(self, seed: int) -> Pair:
        s = _case_seed(seed, self.name)
        if self.neural:
            return neural_pair(self.family, s, self.vocab, self.prompt_len)
        if self.sweep:
            return make_pairs(self.family, s, self.sweep, self.vocab)
        if self.family in NGRAM_FAMILIES:
            order, conc, mix = NGRAM_FAMILIES[self.family]
            p = ngram_pair(s, self.vocab, order, conc, mix)
            # one table order for every n-gram case, so they share a compiled engine call
            return Pair(p.name, lift(p.target, self.order), lift(p.draft, self.order))
        return make_pair(self.family, s, self.vocab)


def _case_seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**31)


def default_cases(budget: Budget, ks=DRAFT_LENGTHS) -> list:
    """The default battery: every pair family x k, n-gram models, serving vocabularies, a sweep."""
    cases = []
    for k in ks:
        for fam in FAMILIES:
            if FAMILIES[fam].default_vocab > 8:  # the serving-vocabulary families: one case each, below
                continue
            cases.append(Case(f"{fam}/V8/k{k}", fam, 8, k, k + 2))
        for fam, (order, _, _) in NGRAM_FAMILIES.items():
            cases.append(Case(f"{fam}/V4/k{k}", fam, 4, k, k + 2, NGRAM_ORDER, model_order=order))
        # hard checks only: every uniform slot at 0 and at 1 - 2^-24 (specsample.battery.boundary)
        cases.append(Case(f"boundary/V8/k{k}", BOUNDARY_FAMILY, 8, k, k + 1, boundary=True))
    # serving vocabularies: a Dirichlet pair at 32k and 131k, a tokenizer-like one; a budget too small for any
    # of them to state a token-law claim (quick) keeps the first, which exercises the engine's large-V path
    serving = SERVING_CASES if budget.large_vocab_sequences >= SERVING_CLAIM_SEQUENCES else SERVING_CASES[:1]
    for fam, v, _ in serving:
        cases.append(Case(f"{fam}/V{v}/k4", fam, v, 4, 2))
    cases.append(Case("sweep-dirichlet/V8/k4", "dirichlet", 8, 4, 2, sweep=budget.sweep_pairs))
    # run only by schemes whose lanes carry state (KV caches): see verify
    for fam, v, prompt, longest, lengths in NEURAL_CASES:
        for k in ks:
            if k in lengths:
                length = 2 * k + 3 if v == LONG_WINDOW_VOCAB else k + 2
                cases.append(Case(f"{fam}/V{v}/k{k}", fam, v, k, min(length, longest), prompt_len=prompt))
    return cases


def named(name: str, item: str) -> bool:
    """Whether one item of a ``--cases`` list (without its ``!``) names case ``name``: the name itself, a
    glob of it or a part of it (the rules :func:`select` tries in turn)."""
    return name == item or fnmatch.fnmatch(name, item) or item in name


def select(cases: list, pattern: Optional[str]) -> list:
    """Cases named by a comma-separated list: each item is an exact case name, else a glob
    (``ngram-*``), else a substring. An item starting with ``!`` excludes what it names
    (``!large-vocab*``: every case but those; with only exclusions, all the others are kept)."""
    if not pattern:
        return cases
    items = [p.strip() for p in pattern.split(",") if p.strip()]
    pats = [p for p in items if not p.startswith("!")]
    drop = [p[1:].strip() for p in items if p.startswith("!")]

    def matches(p):  # an exact name first, then a glob, then a substring
        for rule in (lambda n: n == p, lambda n: fnmatch.fnmatch(n, p), lambda n: p in n):
            hit = [c for c in cases if rule(c.name)]
            if hit:
                return hit
        return []

    chosen = {c.name for p in pats for c in matches(p)} if pats else {c.name for c in cases}
    chosen -= {c.name for p in drop for c in matches(p)}
    out = [c for c in cases if c.name in chosen]
    if not out:
        raise ValueError(f"no case matches {pattern!r}; see `specsample list` for case names")
    return out


# --- planning: which tests, how many samples --------------------------------------------


def _planned_tests(case: Case, scheme: Scheme) -> int:
    staged = 0
    if not (case.sweep or case.boundary or case.neural) and tree_rule(scheme) is not None:
        staged = len(TREE_STAGES)
    elif not (case.sweep or case.boundary) and stages.claimed_rule(scheme) == "standard":
        staged = len(diagnosis.STAGES) - (scheme.step is None)  # a host sampler's drafts are ours: no drafting stage
        if case.vocab > LARGE_VOCAB:  # each token-law stage tested token by token too ([tokens])
            staged += len(diagnosis.TOKEN_STAGES) - (scheme.step is None)
    elif case.neural and isinstance(scheme.step, StatefulStep):
        staged = 1 + (cached_tree_rule(scheme) is not None)  # a token tree: first tokens, and the tree's round law
    return staged + _law_tests_planned(case, scheme)


def _law_tests_planned(case: Case, scheme: Scheme) -> int:
    if case.boundary:
        return 0  # a hard check: outside the Holm family
    if case.sweep:
        return 4
    if case.spans_rounds:  # every position, prefix by prefix, and rounds given their prefix under the standard rule
        return case.length + 2 * (getattr(scheme.step, "rule", None) == "standard")
    if case.neural:  # joint, each position, and rounds per sequence under the standard rule
        return 1 + case.length + (getattr(scheme.step, "rule", None) == "standard")
    n = case.length + 1  # positions + joint (or transitions)
    if case.vocab > LARGE_VOCAB:  # the token chi-square of each position (battery.suite.token_tested)
        n += case.length
    if case.order == 0:
        n += (scheme.accepted_law is not None) + (scheme.token_acceptance is not None)
    else:
        n += 1
    return n


def _sequences(case: Case, budget: Budget, level: float, power: float, explicit: Optional[int]) -> int:
    if explicit:
        return int(explicit)
    if case.sweep:
        return budget.sweep_sequences
    if case.vocab > LARGE_VOCAB:
        cap = next((c for fam, v, c in SERVING_CASES if (fam, v) == (case.family, case.vocab)), None)
        return budget.large_vocab_sequences if cap is None else min(budget.large_vocab_sequences, cap)
    need = stats.samples_for_tv(budget.tv, case.vocab - 1, level, power).n
    cap = budget.neural_sequences if case.neural else budget.max_sequences
    if case.spans_rounds:  # a sequence of 2k + 3 tokens costs many neural rounds (k = 8: 33-65 s per 32,768)
        cap = min(cap, LONG_WINDOW_SEQUENCES)
    return int(min(need, cap))
