"""`tandem bench`: latency, throughput, serve and spec benchmarks (like `vllm bench`)."""
