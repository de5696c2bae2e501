"""The simulated OpenAI-compatible LLM provider (tests, demo, benchmarks).

:mod:`.server` answers requests with fake tokens paced by a latency profile,
:mod:`.connection` is its small HTTP/1.1 layer, :mod:`.reply` the reply shapes,
:mod:`.latency` the profile and schedule, :mod:`.cli` the command line.
"""
