"""The model: what the textbook and torch say a strategy should send and hold (theory), α-β cost
of collectives and the memory model (costmodel), fitting them to a run (fit), a simulator that
writes ordinary traces (simprofile → simcore → simtrace, driven by simulate) and the advisor."""
