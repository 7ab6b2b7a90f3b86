"""Hugging Face assisted generation, end to end, on tiny random-weight Llama models (no download).

    specsample verify --generate examples/hf_assisted.py:assisted --next-token examples/hf_assisted.py:next_token \
        --plain examples/hf_assisted.py:plain --inputs logits --prompt 1,2,3 --length 3 --sequences 4000

The target is a 2-layer Llama of width 32 and the assistant a 1-layer one of width 16, both over
8 tokens with weights drawn from fixed seeds; `assisted` is `target.generate(..., assistant_model=
draft, do_sample=True)` with its KV caches and logits processors, `plain` the same call without the
assistant, and `next_token` the target's teacher-forced logits. Needs torch and transformers.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging

from specsample.host.adapters import hf_generate, hf_next_token

logging.set_verbosity_error()


def tiny_llama(seed: int, layers: int, hidden: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=8, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0,
                         eos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


target, draft = tiny_llama(1, 2, 32), tiny_llama(2, 1, 16)
next_token = hf_next_token(target)
assisted = hf_generate(target, assistant=draft)
plain = hf_generate(target)
