"""The battery: cases -> engine -> statistics -> a verdict, and every test a case runs.

- :mod:`.cases`: budgets, the default cases and the plan of tests with their sample sizes;
- :mod:`.suite`: :func:`verify`, which runs the cases and corrects every p-value with Holm;
- :mod:`.report`: the report, its table, headline and JSON;
- :mod:`.sequential`: prefix-by-prefix tests for windows too long for a joint;
- :mod:`.stages` and :mod:`.diagnosis`: the stage pass that names a broken stage (drafting,
  acceptance, residual, bonus);
- :mod:`.boundary` and :mod:`.edges`: hard checks at extreme uniforms and floating-point edge rows.

``specsample.battery`` re-exports the API of the suite, as it did when it was one module.
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "suite": ("BUDGETS DEFAULT_ALPHA DEFAULT_POWER MIN_EXPECTED NEURAL_BLOCK NGRAM_FAMILIES Budget Case "
        "SchemeError check_seed default_cases law_tests resolve_budget select verify"),
})
