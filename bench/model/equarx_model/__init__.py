"""bench/model's harness: Gemma 3 270M (Q4_K_M, dequantized to f32) run
tensor-parallel on XLA:CPU with and without equarx, scored on the Lee corpus.

artifacts (pinned downloads) → weights, tokenizer → gemma (the forward),
reference (float64 numpy) → doors (equarx in) → evaluate (scoring) →
harness (programs, sanity checks, compile times); capture (psum inputs).
"""
