"""Which LangSplat checkout external mode drives, and what each stage needs from it.

    python -c "from hpc.jobs.langsplat.checkout import detect; print(detect('/opt/LangSplat', None))"

Two checkouts are supported, told apart by their files:
- fork (jiagaoxiang/LangSplat): has train_ddp.py; its train.py trains RGB with --no_include_feature
  and train_ddp.py trains each feature level on many GPUs;
- upstream (minghanqin/LangSplat): no train_ddp.py, and its train.py cannot train RGB (feature
  training is always on), so graphdeco's gaussian-splatting checkout trains RGB.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

FORK, UPSTREAM = "fork", "upstream"
# The scripts each stage runs, relative to the LangSplat checkout.
SCRIPTS = {"preprocess": "preprocess.py", "ae_train": "autoencoder/train.py", "ae_encode": "autoencoder/test.py",
           "features": "train.py", "render": "render.py", "eval": "eval/evaluate_iou_loc.py"}
# OpenCLIP's ViT-B-16 laion2b_s34b_b88k (preprocess.py and eval) comes from this Hugging Face repo.
CLIP_REPO_DIR = "models--laion--CLIP-ViT-B-16-laion2B-s34B-b88K"
CLIP_FILES = ("open_clip_pytorch_model.bin", "open_clip_model.safetensors")


def detect(langsplat_dir: Optional[str], gaussian_splatting_dir: Optional[str]) -> str:
    """fork when the checkout has train_ddp.py, else upstream."""
    return FORK if langsplat_dir and (Path(langsplat_dir) / "train_ddp.py").is_file() else UPSTREAM


def hub_cache(hf_home: str | Path) -> Path:
    """Where huggingface_hub (used by open_clip) looks for models when HF_HOME=hf_home."""
    return Path(hf_home) / "hub"


def clip_weights(hf_home: str | Path) -> Optional[Path]:
    """The pre-staged CLIP weight file under hf_home, or None. Offline, huggingface_hub resolves the
    revision "main" through refs/main (the commit it names) to snapshots/<commit>/: a snapshot
    without that file is not found."""
    repo = hub_cache(hf_home) / CLIP_REPO_DIR
    ref = repo / "refs" / "main"
    if not ref.is_file():
        return None
    snapshot = repo / "snapshots" / ref.read_text().strip()
    return next((snapshot / n for n in CLIP_FILES if (snapshot / n).is_file()), None)


def offline_env(hf_home: str | Path) -> dict:
    """Variables that make open_clip load the pre-staged weights and never try the network."""
    return {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}


def missing_scripts(root: Optional[str], scripts: List[str]) -> List[str]:
    return [s for s in scripts if not (root and (Path(root) / s).is_file())]

