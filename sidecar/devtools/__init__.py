"""Developer tools: the demo, the benchmarks and the process harness they share
with the integration tests (real Envoy, sidecar and fake providers on 127.0.0.1)."""
