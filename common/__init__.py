"""Everything no phase teaches: weights, configs, tokenizer, reference runner, sampling params,
workloads, the bench harness, roofline, results io and plots."""
