"""bench/gpu/torch_stack.py: the torch stack a wheelhouse carries for a host with its own torch.

The requirement lists are the packages' own metadata as PyPI serves it (torch 2.11.0 and 2.14.0,
vLLM 0.26.0 and 0.33.0); the last test asks PyPI itself, as wheelhouse.sh does."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "torch_stack.py"
_spec = importlib.util.spec_from_file_location("torch_stack", SCRIPT)
assert _spec and _spec.loader
torch_stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_stack)

LINUX = '; platform_system == "Linux"'
TORCH_2_11 = [
    "filelock",
    "setuptools<82",
    f"cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.2{LINUX}",
    f"cuda-bindings<14,>=13.0.3{LINUX}",
    f"nvidia-cudnn-cu13==9.19.0.56{LINUX}",
    f"nvidia-cusparselt-cu13==0.8.0{LINUX}",
    f"nvidia-nccl-cu13==2.28.9{LINUX}",
    f"nvidia-nvshmem-cu13==3.4.5{LINUX}",
    f"triton==3.6.0{LINUX}",
    'optree>=0.13.0; extra == "optree"',
]
TORCH_2_14 = [
    "filelock",
    "setuptools>=77.0.3",
    f"cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3{LINUX}",
    f'cuda-bindings<14,>=13.0.3{LINUX} and python_version < "3.15"',
    f"nvidia-cudnn-cu13==9.24.0.43{LINUX}",
    f"nvidia-cusparselt-cu13==0.8.1{LINUX}",
    f"nvidia-nccl-cu13==2.30.7{LINUX}",
    f"nvidia-nvshmem-cu13==3.4.5{LINUX}",
    f'triton~=3.8.0{LINUX} and python_version < "3.15"',
    'optree>=0.13.0; extra == "optree"',
]
VLLM_0_26 = ["torch==2.11.0", "torchaudio==2.11.0", "torchvision==0.26.0", "transformers>=5.5"]
VLLM_0_33 = [
    "transformers<5.21.0,>=5.16.1",
    "torch==2.14.0",
    "torchaudio==2.11.0",
    "torchvision==0.29.0",
    "nvidia-cutlass-dsl[cu13]==4.8.0",
]


def test_a_vllm_on_the_hosts_torch_carries_nothing() -> None:
    assert torch_stack.carried(VLLM_0_26, TORCH_2_11, TORCH_2_11) == []


def test_another_torch_carries_what_differs_by_release() -> None:
    specs = torch_stack.carried(VLLM_0_33, TORCH_2_14, TORCH_2_11)
    assert specs == [
        "torch==2.14.0",
        "torchvision==0.29.0",
        # cuDNN and NCCL moved a minor release; torch refuses an older cuDNN than its own
        "nvidia-cudnn-cu13==9.24.0.43",
        "nvidia-nccl-cu13==2.30.7",
        "triton~=3.8.0",
    ]
    # the host's stay: the same torchaudio pin, CUDA 13.0.x, cuSPARSELt 0.8.x, the same NVSHMEM
    assert not any(
        s.startswith(("torchaudio", "cuda-toolkit", "nvidia-cusparselt", "nvidia-nvshmem"))
        for s in specs
    )


def test_triton_is_judged_against_the_hosts_installed_release() -> None:
    torch = [r.replace("~=3.8.0", "~=3.6.0") for r in TORCH_2_14]
    assert "triton~=3.6.0" not in torch_stack.carried(VLLM_0_33, torch, TORCH_2_11)
    # a host whose triton is older than the release torch asks for gets it carried, although the
    # host torch's own pin is not an `==` the generic rule could compare
    older = {**torch_stack.HOST_STACK, "triton": "3.5.1"}
    assert "triton~=3.6.0" in torch_stack.carried(VLLM_0_33, torch, TORCH_2_11, older)


def test_pins_leave_out_extras_and_other_platforms() -> None:
    got = torch_stack.pins(
        [
            'optree>=0.13.0; extra == "optree"',
            'pywin32==306; platform_system == "Windows"',
            'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
            "numpy>=2",
        ]
    )
    assert got == {"nvidia-nccl-cu13": ("==", "2.30.7")}


def test_pypi_says_the_same_for_vllm_0_33() -> None:
    """What wheelhouse.sh runs: the metadata from PyPI, no downloads."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "0.33.0"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert out.stdout.split() == [
        "torch==2.14.0",
        "torchvision==0.29.0",
        "nvidia-cudnn-cu13==9.24.0.43",
        "nvidia-nccl-cu13==2.30.7",
        "triton~=3.8.0",
    ]


def test_the_resolution_sees_the_carried_versions_and_the_hosts_others() -> None:
    specs = torch_stack.carried(VLLM_0_33, TORCH_2_14, TORCH_2_11)
    assert torch_stack.stand_ins(specs) == [
        "torch==2.14.0",
        "torchvision==0.29.0",
        "torchaudio==2.11.0",  # vLLM 0.33 pins the host's
        "triton==3.8.0",
    ]
    assert torch_stack.stand_ins([]) == [f"{n}=={v}" for n, v in torch_stack.HOST_STACK.items()]
