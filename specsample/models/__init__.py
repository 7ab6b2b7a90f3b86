"""Models: what p and q are. The first stage of the data's way; imports nothing else of specsample.

- :mod:`.interface`: what a round may ask of a model (the contract a user's wrapper honours);
- :mod:`.tables`: table models (context-free and n-gram probability tables, warping, alias tables,
  exact joints by enumeration);
- :mod:`.pairs`: the families of target/draft pairs the battery draws (Dirichlet, peaked, rare
  acceptance, n-gram, neural);
- :mod:`.transformer`: a small decoder-only transformer with a KV cache;
- :mod:`.tree_attention`: tree attention over a flattened token tree and KV compaction.

``specsample.models`` re-exports the table models, as it did when it was one module.
"""

from .._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "interface": "Model",
    "tables": ("AliasTable PROB_ATOL PackedAlias Residuals TableModel all_sequences context_free exact_joint "
        "exact_marginals draw_weights initial_context inverse_cdf last_positive lift ngram pair_for_device "
        "random_ngram validate_table warp warp_probs window_index"),
})
