"""Stand-in for graphdeco's rasterizer (submodules/diff-gaussian-rasterization): no include_feature
in its settings, and a call returns the image and the radii. Only the interface."""
from typing import Any, NamedTuple


class GaussianRasterizationSettings(NamedTuple):
    image_height: int
    image_width: int
    tanfovx: float
    tanfovy: float
    bg: Any
    scale_modifier: float
    viewmatrix: Any
    projmatrix: Any
    sh_degree: int
    campos: Any
    prefiltered: bool
    debug: bool


class GaussianRasterizer:
    def __init__(self, raster_settings: GaussianRasterizationSettings):
        self.raster_settings = raster_settings

    def __call__(self, means3D, means2D, opacities, shs=None, colors_precomp=None, scales=None, rotations=None,
                 cov3D_precomp=None):
        return "image", "radii"
