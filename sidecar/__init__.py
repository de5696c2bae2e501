"""tailroute: an Envoy ext_proc sidecar that routes LLM traffic by observed tail latency."""
