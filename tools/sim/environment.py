"""The distributions a container image's Python environment holds beside the ones a scenario names.

Real inference images carry 200-400 distributions, most installed in one layer at one time.
A scenario's ``host.environment.extra`` picks that many from this list (in order); each is
laid out like the scenario's own packages, and every fourth has a compiled file.
"""

from __future__ import annotations

import hashlib

PIP_VERSION = "24.0"  # the pip every simulated host lists (its code is this interpreter's own pip)

NAMES = """
absl-py accelerate aiohappyeyeballs aiohttp aiosignal airportsdb annotated-types anthropic antlr4-python3-runtime
anyio argcomplete astor asttokens attrs audioread av bitsandbytes blake3 blobfile boto3 botocore build
cachetools cbor2 certifi cffi charset-normalizer click cloudpickle cmake colorama coloredlogs compressed-tensors
contourpy cryptography cuda-bindings cuda-python cupy-cuda12x cycler datasets decorator decord deepspeed depyf dill
diskcache distro dnspython docstring-parser einops email-validator executing fastapi fastapi-cli fastrlock
filelock flatbuffers fonttools frozenlist fsspec gguf gitdb gitpython googleapis-common-protos grpcio h11
hf-transfer hf-xet httpcore httptools httpx huggingface-hub humanfriendly idna importlib-metadata iniconfig
interegular ipython jedi jinja2 jiter jmespath joblib jsonschema jsonschema-specifications kiwisolver lark
lazy-loader librosa llguidance llvmlite lm-format-enforcer markdown-it-py markupsafe matplotlib matplotlib-inline
mdurl mistral-common modelscope mpmath msgpack msgspec multidict multiprocess nest-asyncio networkx ninja
numba numpy nvidia-cublas-cu12 nvidia-cuda-cupti-cu12 nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12
nvidia-cudnn-cu12 nvidia-cufft-cu12 nvidia-cufile-cu12 nvidia-curand-cu12 nvidia-cusolver-cu12
nvidia-cusparse-cu12 nvidia-cusparselt-cu12 nvidia-ml-py nvidia-nccl-cu12 nvidia-nvjitlink-cu12
nvidia-nvtx-cu12 openai opencv-python-headless opentelemetry-api opentelemetry-sdk orjson outlines
outlines-core packaging pandas parso partial-json-parser peft pexpect pillow platformdirs pluggy pooch
prometheus-client prometheus-fastapi-instrumentator prompt-toolkit propcache protobuf psutil ptyprocess
pure-eval py-cpuinfo py-spy pyarrow pybase64 pycountry pycparser pydantic pydantic-core pydantic-settings
pygments pyparsing pytest python-dateutil python-dotenv python-json-logger python-multipart pytz pyyaml pyzmq
ray referencing regex requests rich rich-toolkit rignore rpds-py s3transfer safetensors scikit-learn scipy
sentencepiece sentry-sdk setproctitle setuptools shellingham six smmap sniffio soundfile soxr stack-data
starlette sympy tabulate tensorboard threadpoolctl tiktoken timm tokenizers tomli torchao torchaudio
torchvision tqdm traitlets transformers typer typing-extensions typing-inspection tzdata urllib3 uvicorn
uvloop watchfiles wcwidth websockets wheel xgrammar xxhash yarl zipp zstandard
""".split()


def extra_distributions(count: int, skip: set[str]) -> list[tuple[str, str, bool]]:
    """``count`` (name, version, has a compiled file) not in ``skip`` (normalised names), in list order."""
    out: list[tuple[str, str, bool]] = []
    for name in NAMES:
        if len(out) >= count:
            break
        if name.replace("-", "_").lower() in skip:
            continue
        h = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
        out.append((name, f"{1 + h % 4}.{h // 4 % 30}.{h // 120 % 10}", len(out) % 4 == 3))
    return out
