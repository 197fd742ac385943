"""Where the math runs: the device and precision a run or a translation gets (bf16 only where
the hardware has it natively), the torchrun process group (ranks, reductions, signals), and
the host memory the process keeps for reuse (glibc's malloc settings).
"""
