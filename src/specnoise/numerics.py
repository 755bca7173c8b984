"""How model calls compute: which SDPA attention kernels run, and strict numerics for bit-consistent verification.

One policy per loaded model (``use_numerics``), entered around every model call the engine makes
(the engines' ``forward``, the HF ``generate()`` peers, warm-up and self-test all go through those two) with
``numerics(model)``. Torch's process-wide flags are only changed inside that context and restored on exit, so
other code in the process never sees them. The context sets the four backend switches with torch's public
``torch.backends.cuda.enable_*_sdp`` rather than ``torch.nn.attention.sdpa_kernel``, which does the same plus
priority bookkeeping at ~5x the cost (65-90 vs 15 us per call on a loaded CPU, paid once per decoding step).

Why a backend policy: on Hopper torch prefers cuDNN attention for bf16/fp16, and cuDNN builds an execution plan
per new (query length, key length, mask) shape; every decoding step has a new shape, which made every decoder
(AR included) 2-5x slower on the H100. The default therefore allows every backend except cuDNN; torch tries the
allowed ones in its own order: flash (no custom masks: one-token AR steps and plain prefills), efficient (takes
additive tree masks), math. Math is always allowed as the last resort, so no call can find itself without a
kernel (CPU builds have no efficient kernel at all).

Strict numerics (``benchmark.strict_numerics=true``): math-only attention for AR and every decoder, no
reduced-precision (bf16/fp16) reductions in cuBLAS matmuls or in math attention, fp32 matmuls at full precision.
It removes the kernel-choice differences between a one-token AR step and a multi-token verify; what remains (GEMM
tiling per shape) is why bf16 can still diverge (README, "Numerics and losslessness"). It does not switch on
``torch.use_deterministic_algorithms``: that call alone costs ~400 us (measured on CPU), twice per model call,
and a decoder-only inference forward has no nondeterministic kernel to replace (cuBLAS repeats itself for one
shape on one stream); for bit-reproducible cuBLAS set ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` before starting.
"""

from __future__ import annotations

import platform
from contextlib import nullcontext
from dataclasses import dataclass

import torch

_cuda = torch.backends.cuda
SWITCHES = {"flash": (_cuda.flash_sdp_enabled, _cuda.enable_flash_sdp),  # backend: (getter, setter)
            "efficient": (_cuda.mem_efficient_sdp_enabled, _cuda.enable_mem_efficient_sdp),
            "math": (_cuda.math_sdp_enabled, _cuda.enable_math_sdp),
            "cudnn": (_cuda.cudnn_sdp_enabled, _cuda.enable_cudnn_sdp)}
DEFAULT_BACKENDS = ("flash", "efficient", "math")  # everything but cuDNN (per-shape plan building)
ATTR = "specnoise_numerics"  # the policy travels with the model object, so every caller of the model finds it


@dataclass(frozen=True)
class Numerics:
    backends: tuple[str, ...] = DEFAULT_BACKENDS  # () = torch's own choice
    strict: bool = False

    def sdpa(self) -> list[str]:
        """The backends allowed; [] = torch's own choice."""
        if self.strict:
            return ["math"]
        return list(dict.fromkeys([*self.backends, "math"])) if self.backends else []


def use_numerics(model: torch.nn.Module, backends: list[str] | tuple[str, ...] | None = None,
                 strict: bool | None = None) -> Numerics:
    """Attach a policy to ``model`` (unset arguments keep the model's current one); returns it."""
    old = policy(model)
    new = Numerics(tuple(old.backends if backends is None else backends), old.strict if strict is None else strict)
    setattr(model, ATTR, new)
    return new


def policy(model: torch.nn.Module) -> Numerics:
    return getattr(model, ATTR, None) or Numerics()


def numerics(model: torch.nn.Module):
    """A context running model calls under ``model``'s policy; every flag touched is restored on exit.

    Entered once per model call, so it is kept to a few flag reads and writes (~15 us on a loaded CPU)."""
    p = policy(model)
    if p.strict:
        return _Strict()
    return _Backends(p.sdpa()) if p.sdpa() else nullcontext()


class _Backends:
    """Allow exactly ``allowed`` SDPA backends inside; restores every switch on exit."""

    def __init__(self, allowed: list[str]):
        self.wanted = [(getter, setter, name in allowed) for name, (getter, setter) in SWITCHES.items()]

    def __enter__(self):
        # only the switches that differ are set and restored (usually cuDNN's alone): a setter costs ~10 us
        self.changed = [(setter, on) for getter, setter, on in self.wanted if getter() != on]
        for setter, on in self.changed:
            setter(on)

    def __exit__(self, *exc):
        for setter, on in self.changed:
            setter(not on)


class _Strict(_Backends):
    """Math-only attention, no reduced-precision reductions, full-precision fp32 matmuls."""

    def __init__(self):
        super().__init__(["math"])

    def __enter__(self):
        super().__enter__()
        matmul = _cuda.matmul
        self.reductions = (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction,
                           _cuda.fp16_bf16_reduction_math_sdp_allowed(), torch.get_float32_matmul_precision())
        matmul.allow_bf16_reduced_precision_reduction = False
        matmul.allow_fp16_reduced_precision_reduction = False
        _cuda.allow_fp16_bf16_reduction_math_sdp(False)
        torch.set_float32_matmul_precision("highest")

    def __exit__(self, *exc):
        bf16, fp16, math_sdp, fp32 = self.reductions
        _cuda.matmul.allow_bf16_reduced_precision_reduction = bf16
        _cuda.matmul.allow_fp16_reduced_precision_reduction = fp16
        _cuda.allow_fp16_bf16_reduction_math_sdp(math_sdp)
        torch.set_float32_matmul_precision(fp32)
        super().__exit__(*exc)


def describe(model: torch.nn.Module) -> dict:
    """What results.json's meta records about how the numbers were computed."""
    import transformers

    device = next(model.parameters()).device
    p = policy(model)
    return {
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine() or "cpu"),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "sdpa_backends": p.sdpa() or "auto",
        "strict_numerics": p.strict,
        "transformers": transformers.__version__,
    }
