"""LangSplat pipeline: stage 1 trains RGB geometry, stage 2 one language-feature level per task.

    python -m hpc.submit langsplat --levels 0 1 2

The built-in reference trainer (render, scene, gaussians, metrics, stages) runs anywhere on CPU or
GPU; external mode runs a real LangSplat checkout through command templates instead.
"""
