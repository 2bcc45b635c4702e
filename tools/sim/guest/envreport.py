"""An engine's own environment report, as a simulated host's engine prints it: ``python -m sglang.check_env``
(``Name: version`` lines) or ``python -m vllm.collect_env`` (sections, ``[pip3] name==version``), from the
distributions installed now and the driver nvidia-smi reports."""

import platform
import subprocess
from importlib import metadata

STYLE = ""
NAMES = ("sglang", "sgl_kernel", "flashinfer_python", "triton", "torch", "transformers", "vllm", "numpy")


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "Module Not Found"


def driver() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> None:
    drv, _, gpu = driver().partition(", ")
    if STYLE == "check_env":
        print(f"Python: {platform.python_version()}")
        print("CUDA available: True")
        if gpu:
            print(f"GPU 0: {gpu}")
        print(f"CUDA Driver Version: {drv or 'could not collect'}")
        for n in NAMES:
            print(f"{n}: {version(n.replace('_', '-'))}")
        return
    print("==============================\n        System Info\n==============================")
    print(f"Python version               : {platform.python_version()}")
    print(f"Nvidia driver version        : {drv or 'Could not collect'}")
    print(f"GPU models and configuration : {('GPU 0: ' + gpu) if gpu else 'Could not collect'}")
    print("==============================\n       vLLM Info\n==============================")
    print(f"vLLM Version                 : {version('vllm')}")
    print("==============================\n    Versions of relevant libraries\n==============================")
    for n in NAMES:
        v = version(n.replace("_", "-"))
        if v != "Module Not Found":
            print(f"[pip3] {n.replace('_', '-')}=={v}")


if __name__ == "__main__":
    main()
