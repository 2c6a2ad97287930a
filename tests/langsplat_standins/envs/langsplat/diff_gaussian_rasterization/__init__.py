"""Stand-in for LangSplat's rasterizer (submodules/langsplat-rasterization), installed under the
module name graphdeco's uses: its settings have include_feature, and a call returns the image, the
language feature image and the radii. Only the interface: the stand-in scripts compute their own."""
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
    include_feature: bool


class GaussianRasterizer:
    def __init__(self, raster_settings: GaussianRasterizationSettings):
        self.raster_settings = raster_settings

    def __call__(self, means3D, means2D, opacities, shs=None, colors_precomp=None, language_feature_precomp=None,
                 scales=None, rotations=None, cov3D_precomp=None):
        return "image", "language_feature_image", "radii"
