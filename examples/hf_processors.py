"""A loop whose logits processors read the history: Hugging Face generation with a repetition penalty.

    specsample verify --generate examples/hf_processors.py:assisted --next-token examples/hf_processors.py:next_token \
        --plain examples/hf_processors.py:plain --inputs logits --prompt 1,2,3 --length 3 --sequences 4000

The target's law is that of its logits *after* the processors, which read every token so far
(prompt included): `next_token` applies the same `RepetitionPenaltyLogitsProcessor` at each
position with the history up to it (`hf_next_token(model, processors=...)`), then the same temperature
as `generate` (0.1: the tiny random models' logits are near 0, and a multiplicative penalty would
barely move them). `next_token_raw` forgets the penalty, and then even the plain arm fails: the
processors are part of the law. The models are
`hf_assisted.py`'s (imported from beside this file). Needs torch and transformers.
"""

from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper

from hf_assisted import draft, target
from specsample.host.adapters import hf_generate, hf_next_token

PENALTY, TEMPERATURE = 2.0, 0.1  # random tiny models have logits near 0: a low temperature makes the penalty count

next_token = hf_next_token(target, processors=LogitsProcessorList(
    [RepetitionPenaltyLogitsProcessor(PENALTY), TemperatureLogitsWarper(TEMPERATURE)]))
next_token_raw = hf_next_token(target, processors=[TemperatureLogitsWarper(TEMPERATURE)])  # forgets the penalty
assisted = hf_generate(target, assistant=draft, repetition_penalty=PENALTY, temperature=TEMPERATURE)
plain = hf_generate(target, repetition_penalty=PENALTY, temperature=TEMPERATURE)
