"""The decoder: config, model, paged KV cache, scheduler, sampler, runner, copy kernels."""
