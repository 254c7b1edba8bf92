"""``fp8sim run --device-map cuda=cpu``: scripts that hard-code CUDA run on the CPU (an emulation
convenience, not an emulation of CUDA).

:func:`install` enters a global ``TorchFunctionMode`` that rewrites every CUDA device argument
(``device="cuda"``, ``.to("cuda:0")``, ``.cuda()``, ``torch.device("cuda")`` objects) to the CPU,
makes ``torch.autocast("cuda", ...)`` a CPU autocast, and answers ``torch.cuda``'s common queries
as one emulated device (``is_available()`` True, ``device_count()`` 1, ``synchronize()`` a no-op,
``manual_seed`` seeds the CPU generator, ``get_device_capability()`` the emulated device's).
Memory statistics, streams, events and CUDA graphs are not emulated.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "parse_device_map"]

_installed: dict[str, Any] = {}


def parse_device_map(spec: str) -> dict[str, str]:
    """``"cuda=cpu"`` -> ``{"cuda": "cpu"}`` (the only mapping fp8sim offers)."""
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        src, sep, dst = item.partition("=")
        if not sep or src.strip() != "cuda" or dst.strip() != "cpu":
            raise ValueError(f"--device-map {spec!r}: expected 'cuda=cpu' (the only mapping fp8sim emulates)")
        out["cuda"] = "cpu"
    if not out:
        raise ValueError(f"--device-map {spec!r}: expected 'cuda=cpu'")
    return out


def _is_cuda(d: Any) -> bool:
    import torch

    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.split(":")[0] == "cuda"
    return False


def _map(v: Any) -> Any:
    import torch

    if _is_cuda(v):
        return torch.device("cpu")
    if isinstance(v, (list, tuple)):
        return type(v)(_map(x) for x in v)
    return v


def install(mapping: dict[str, str] | None = None) -> None:
    """Route CUDA to the CPU in this process (idempotent)."""
    if _installed:
        return
    import torch
    from torch.overrides import TorchFunctionMode

    cuda_method = torch.Tensor.cuda

    class _CudaToCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if func is cuda_method:
                return args[0].cpu()
            if "device" in kwargs:
                kwargs = {**kwargs, "device": _map(kwargs["device"])}
            if func in (torch.Tensor.to, torch.Tensor.new_empty, torch.Tensor.new_zeros) or _is_tensor_factory(func):
                args = tuple(_map(a) for a in args)
            return func(*args, **kwargs)

    mode = _CudaToCpu()
    mode.__enter__()  # for the rest of the process
    _installed["mode"] = mode
    _patch_cuda_queries()
    _patch_autocast()
    _patch_module_cuda()


def _is_tensor_factory(func: Any) -> bool:
    return getattr(func, "__name__", "") in ("tensor", "as_tensor", "empty", "zeros", "ones", "full", "randn", "rand")


def _patch_cuda_queries() -> None:
    import torch

    def capability(device: Any = None) -> tuple[int, int]:
        from ..pytorch.utils import get_device_compute_capability

        return get_device_compute_capability()

    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device: None
    cuda.synchronize = lambda device=None: None
    cuda.empty_cache = lambda: None

    def seed(seed: int) -> None:  # the CPU generator (torch.manual_seed calls this one too: no recursion)
        torch.default_generator.manual_seed(int(seed))

    cuda.manual_seed = seed
    cuda.manual_seed_all = seed
    # the one emulated device draws from the CPU generator, so its RNG state is the CPU one
    cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    cuda.set_rng_state = lambda new_state, device="cuda": torch.set_rng_state(new_state)
    cuda.get_rng_state_all = lambda: [torch.get_rng_state()]
    cuda.set_rng_state_all = lambda new_states: torch.set_rng_state(list(new_states)[0])
    cuda.is_bf16_supported = lambda including_emulation=True: True
    cuda.get_device_capability = capability
    cuda.get_device_name = lambda device=None: "fp8sim emulated GPU (CPU)"


def _patch_autocast() -> None:
    import torch

    base = torch.autocast

    class autocast(base):  # noqa: N801 - torch's name
        def __init__(self, device_type: str, dtype: Any = None, *args: Any, **kwargs: Any) -> None:
            # CUDA autocast takes float32; torch's CPU autocast refuses it with a warning and turns itself
            # off, so the CPU one is entered with float32 set after its check (its casts accept it)
            f32 = _is_cuda(device_type) and dtype == torch.float32
            device = "cpu" if _is_cuda(device_type) else device_type
            super().__init__(device, torch.bfloat16 if f32 else dtype, *args, **kwargs)
            if f32:
                self.fast_dtype = torch.float32

    torch.autocast = autocast
    torch.amp.autocast = autocast

    class cuda_autocast(base):  # noqa: N801 - torch.cuda.amp.autocast
        def __init__(self, enabled: bool = True, dtype: Any = torch.float16, cache_enabled: bool = True) -> None:
            super().__init__("cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.cuda.amp.autocast = cuda_autocast


def _patch_module_cuda() -> None:
    import torch

    torch.nn.Module.cuda = lambda self, device=None: self  # parameters stay on the CPU
