"""Where the math runs: the device and precision a run or a translation gets (bf16 only where
the hardware has it natively), and the torchrun process group (ranks, reductions, signals).
"""
