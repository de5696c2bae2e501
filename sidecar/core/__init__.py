"""The pure decision core: takes `now` and an RNG, reads no clock, does no I/O."""
