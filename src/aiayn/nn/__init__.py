"""The network of the paper (§3): attention and multi-head attention, positions, the encoder and
decoder stacks, `Transformer`, the encoder-only and decoder-only variants, the KV cache that
incremental decoding carries, and the taps (`tracing`) that record every intermediate.
"""
