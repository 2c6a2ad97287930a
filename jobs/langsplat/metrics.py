"""Metrics of the reference trainer: PSNR, segment accuracy and mIoU, relevancy maps.

    from hpc.jobs.langsplat.metrics import psnr, decode, segmentation_scores, relevancy
    psnr(rendered, target)                                # dB, images in [0, 1]
    pred = decode(features, embeddings)                    # nearest segment embedding per pixel
    segmentation_scores(pred, labels, n_segments)          # {"accuracy": ..., "miou": ...}

Decoding and relevancy use cosine similarity, as LangSplat compares rendered features with CLIP
text embeddings; the relevancy of a query is its softmax share against all segments of the level.
"""
from __future__ import annotations

import math

import torch


def psnr(pred: torch.Tensor, target: torch.Tensor) -> float:
    mse = float(torch.mean((pred.float() - target.float()) ** 2))
    return float("inf") if mse == 0 else 10.0 * math.log10(1.0 / mse)


def _cosine(features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    f = features / features.norm(dim=-1, keepdim=True).clamp(min=1e-8)
    return f @ embeddings.T


def decode(features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
    """(..., D) features -> (...) index of the most similar embedding."""
    return _cosine(features, embeddings).argmax(dim=-1)


def confusion(pred: torch.Tensor, labels: torch.Tensor, n_segments: int) -> torch.Tensor:
    """(n, n) counts over pixels with a label (labels < 0 are background and not scored).
    Built with bincount, which is deterministic, unlike scatter-add on some devices."""
    mask = labels >= 0
    idx = labels[mask] * n_segments + pred[mask]
    return torch.bincount(idx, minlength=n_segments * n_segments).reshape(n_segments, n_segments)


def scores_from_confusion(conf: torch.Tensor) -> dict:
    """Pixel accuracy and mean IoU over segments that occur (in labels or predictions)."""
    conf = conf.double()
    tp = conf.diag()
    total = conf.sum()
    union = conf.sum(0) + conf.sum(1) - tp
    present = union > 0
    return {"accuracy": float(tp.sum() / total) if total > 0 else 0.0,
            "miou": float((tp[present] / union[present]).mean()) if present.any() else 0.0}


def segmentation_scores(pred: torch.Tensor, labels: torch.Tensor, n_segments: int) -> dict:
    return scores_from_confusion(confusion(pred.reshape(-1), labels.reshape(-1), n_segments))


def relevancy(features: torch.Tensor, embeddings: torch.Tensor, query: int,
              temperature: float = 0.1) -> torch.Tensor:
    """(..., D) features -> (...) relevancy in [0, 1] of segment `query`: softmax over the cosine
    similarities to every segment of the level. Pixels without feature (background) get 0."""
    if not 0 <= query < embeddings.shape[0]:
        raise ValueError(f"query segment {query} is out of range: this level has "
                         f"{embeddings.shape[0]} segments. HINT: set trainer.query_segment "
                         f"between 0 and {embeddings.shape[0] - 1}")
    sim = _cosine(features, embeddings) / temperature
    rel = torch.softmax(sim, dim=-1)[..., query]
    has_feature = features.norm(dim=-1) > 1e-3
    return rel * has_feature
