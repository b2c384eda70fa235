"""Throughput of one policy update: DeepSpeed engine vs a plain-torch loop of the same loss.

    .venv/bin/python bench/train_throughput.py                 # tiny + SmolLM2-135M (CPU); + 0.5B on GPU
    .venv/bin/python bench/train_throughput.py --models tiny --steps 3

Each (model, engine) runs in its own process (one rank, RANK=0 WORLD_SIZE=1), so peak memory is
per configuration: max RSS on CPU, max allocated on GPU. Both engines run rl_core.train.step
.compute_loss (policy forward, frozen reference forward, exact KL over the vocabulary, PPO/IS loss) on the same random-init
model (weights do not change the cost) and the same batches, then AdamW with grad clipping; DeepSpeed
uses the trainer's own ds_config (ZeRO stage --zero, bf16 on GPU, fp32 on CPU), the torch loop
torch.optim.AdamW (autocast bf16 on GPU). tokens/s counts prompt + completion tokens.
The "DeepSpeed cost" column comes from a paired run: one process holds both engines (two copies of the
same policy, one shared reference) and alternates their steps on the same batches, swapping which goes
first each step, and compares median step times. On a small shared CPU the step time drifts by 10-20%
between processes, more than the difference being measured; pairing cancels that drift. MFU (GPU only):
model FLOPs = 6*N_body*tokens (train) + 2*N_body*tokens (reference) + 8*V*d*(kept logits positions),
over the GPU's dense bf16 peak (BENCH_PEAK_TFLOPS overrides the table).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Llama-family shapes: rtrl's tiny test model, SmolLM2-135M, and a Qwen2.5-0.5B-sized model (GPU only)
MODELS = {
    "tiny": dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True),
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
}
PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}


def _build(name: str, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(max_position_embeddings=4096, **MODELS[name])
    return LlamaForCausalLM(cfg).to(dtype)


def _batches(n: int, mb: int, seq: int, comp: int, vocab: int, device) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        ids = torch.randint(100, vocab, (mb, seq), generator=g)  # [B,L]
        out.append({
            "input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
            "position_ids": torch.arange(seq).expand(mb, seq).to(device), "targets": ids[:, -comp:].to(device),
            "loss_mask": torch.ones(mb, comp, device=device), "advantages": torch.randn(mb, generator=g).to(device),
            "comp_len": comp,
        })
    return out


def _stepper(engine: str, policy, tc, lc, ref, device, bf16: bool):
    """One optimizer step of `engine` ("deepspeed": the trainer's own engine, or "torch") on a batch."""
    import torch

    from rl_core.train.step import compute_loss

    if engine == "deepspeed":
        import deepspeed

        from rl_core.train.trainer import make_engine

        if not torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo", verbose=False)
        model = make_engine(policy, list(policy.parameters()), tc, bf16, world=1)

        def step(t):
            out = compute_loss(model, t, lc, ref)
            model.backward(out.loss)
            model.step()
        return step
    model = policy.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def step(t):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = compute_loss(model, t, lc, ref)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def paired(args, policy_t, policy_d, batches, tc, lc, ref, device, bf16) -> dict:
    """Both engines in this process, alternating steps (the order swaps every step); median step times."""
    import statistics

    import torch

    steps = {"torch": _stepper("torch", policy_t, tc, lc, ref, device, bf16),
             "deepspeed": _stepper("deepspeed", policy_d.to(device), tc, lc, ref, device, bf16)}
    times: dict[str, list[float]] = {"torch": [], "deepspeed": []}
    for i, t in enumerate(batches):
        order = ("torch", "deepspeed") if i % 2 == 0 else ("deepspeed", "torch")
        for name in order:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            steps[name](t)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i:  # step 0 is the warm-up of both
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {"model": args.model, "engine": "pair", "pairs": len(times["torch"]), "torch_s": med["torch"],
           "deepspeed_s": med["deepspeed"], "cost": med["deepspeed"] / med["torch"] - 1,
           "cost_per_pair": [d / t - 1 for t, d in zip(times["torch"], times["deepspeed"], strict=True)]}
    print("RESULT " + json.dumps(res), flush=True)
    return res


def one(args) -> dict:
    """Measure one (model, engine) in this process; prints a JSON line."""
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args.port))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "rtrl" / "torch_extensions"))
    import torch

    from rl_core.config import TrainConfig
    from rl_core.train.loss import LossConfig
    from rl_core.train.step import reference_fn

    cuda = torch.cuda.is_available()
    device = torch.device("cuda:0" if cuda else "cpu")
    bf16 = cuda
    tc = TrainConfig(zero_stage=args.zero, micro_batch_size=args.mb, lr=1e-5, kl_coef=0.02)
    lc = LossConfig.from_train(tc)
    policy = _build(args.model, torch.float32)
    policy.config.use_cache = False
    ref_model = _build(args.model, torch.bfloat16 if bf16 else torch.float32).to(device).eval().requires_grad_(False)
    ref = reference_fn(ref_model=ref_model)
    n_body = sum(p.numel() for n, p in policy.named_parameters() if "embed_tokens" not in n)
    n_batches = (args.pairs if args.engine == "pair" else args.steps) + 1
    batches = _batches(n_batches, args.mb, args.seq, args.completion, MODELS[args.model]["vocab_size"], device)
    for t in batches:  # behaviour logprobs = the reference's: ratios start at 1 as on real traffic
        t["behaviour_logprobs"] = ref(t).float()

    if args.engine == "pair":
        return paired(args, policy, _build(args.model, torch.float32), batches, tc, lc, ref, device, bf16)
    step = _stepper(args.engine, policy, tc, lc, ref, device, bf16)
    step(batches[0])  # warm-up (allocations, kernels)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for t in batches[1:]:
        step(t)
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tokens = args.steps * args.mb * args.seq
    kept = args.steps * args.mb * (args.completion + 1)
    flops = 8 * n_body * tokens + 8 * MODELS[args.model]["vocab_size"] * MODELS[args.model]["hidden_size"] * kept
    res = {"model": args.model, "engine": args.engine, "params_m": round(sum(p.numel() for p in policy.parameters()) / 1e6, 1),
           "tokens_per_s": tokens / dt, "s_per_step": dt / args.steps, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
           "precision": "bf16" if bf16 else "fp32", "tflops": flops / dt / 1e12}
    if cuda:
        res["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 2**30
        name = torch.cuda.get_device_name(0)
        peak = float(os.environ.get("BENCH_PEAK_TFLOPS", 0)) or next(
            (v for k, v in PEAK_BF16_TFLOPS.items() if k in name), 0.0)
        res["mfu"] = res["tflops"] / peak if peak else None
    else:
        res["peak_mem_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps(res), flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--mb", type=int, default=None, help="micro batch (default 4 on CPU, 8 on GPU)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 256 on CPU, 1024 on GPU)")
    ap.add_argument("--completion", type=int, default=None, help="completion tokens (default seq/4)")
    ap.add_argument("--pairs", type=int, default=6, help="timed step pairs of the paired run")
    ap.add_argument("--zero", type=int, default=0, help="ZeRO stage of the DeepSpeed engine (the trainer's default: 0)")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "ENGINE"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=29533, help=argparse.SUPPRESS)
    args = ap.parse_args()
    import torch

    cuda = torch.cuda.is_available()
    args.mb = args.mb or (8 if cuda else 4)
    args.seq = args.seq or (1024 if cuda else 256)
    args.completion = args.completion or args.seq // 4
    if args.one:
        args.model, args.engine = args.one
        one(args)
        return
    models = args.models.split(",") if args.models else (["tiny", "smollm2-135m"] + (["0.5b"] if cuda else []))
    rows = []
    for m in models:
        for engine in ("torch", "deepspeed", "pair"):
            cmd = [sys.executable, __file__, "--one", m, engine, "--steps", str(args.steps), "--mb", str(args.mb),
                   "--seq", str(args.seq), "--completion", str(args.completion), "--zero", str(args.zero),
                   "--pairs", str(args.pairs)]
            p = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"DS_ACCELERATOR": "cuda" if cuda else "cpu"})
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                sys.exit(f"{m}/{engine} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
            rows.append(json.loads(line[len("RESULT "):]))
    print(f"\nbatch {args.mb} x {args.seq} tokens ({args.completion} completion), {args.steps} timed steps after 1 "
          f"warm-up, ZeRO-{args.zero} for DeepSpeed, KL reference forward included; DeepSpeed cost: median step "
          f"time of {args.pairs} interleaved pairs in one process (min..max of the pairs)\n")
    print("| model | params | engine | device | precision | tokens/s | s/step | peak mem GB | DeepSpeed cost | MFU |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    by = {(r["model"], r["engine"]): r for r in rows}
    for r in rows:
        if r["engine"] == "pair":
            continue
        pair = by.get((r["model"], "pair"))
        cost = (f"{pair['cost']:+.1%} ({min(pair['cost_per_pair']):+.0%}..{max(pair['cost_per_pair']):+.0%})"
                if r["engine"] == "deepspeed" and pair else "")
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "n/a"
        print(f"| {r['model']} | {r['params_m']}M | {r['engine']} | {r['device']} | {r['precision']} | "
              f"{r['tokens_per_s']:.0f} | {r['s_per_step']:.2f} | {r['peak_mem_gb']:.2f} | {cost} | {mfu} |")


if __name__ == "__main__":
    main()
