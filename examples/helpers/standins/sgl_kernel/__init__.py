"""A stand-in for the part of sgl-kernel the engine uses: `sgl_kernel.flash_attn` (see
examples/helpers/gpu_libraries.py)."""

__version__ = "0.3.21+book-standin"
