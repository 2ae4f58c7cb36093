"""How far two images' bytes are apart: the one measure the exactness checks report
(yuv_rgb_exact, resize_exact, nvdec_exact)."""

from __future__ import annotations

import numpy as np
import torch


def byte_diff(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> dict:
    """max |a - b| and the share of values that differ (on the host); shapes that differ are
    reported instead."""
    a, b = (x.cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (a, b))
    if a.shape != b.shape:
        return {"shape": [list(a.shape), list(b.shape)]}
    d = np.abs(a.astype(np.int32) - b.astype(np.int32))
    return {"max_abs_diff": int(d.max()), "differing_share": float((d > 0).mean())}
